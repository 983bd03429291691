"""Regional compile: the repeated decoder layer compiled once, shared by every layer.

A model opts in by naming, on its decoder layer class, the methods that are
pure tensor work (`rvv_regional_methods`; this project's layers name the work
before and after attention, which reads the batch's layout and the layer's
KV pool and stays eager between them). Each method is compiled once, with
fullgraph, and every layer calls the same compiled function: parameters and
buffers are graph inputs, so layer 7 reuses layer 0's graph. Inside, Inductor
fuses the norms, rotary, SiLU-and-multiply and residual adds around the routed
projections, which stay opaque (`rvascend::routed_linear`) and check their
packed weights when the graph runs.

Graphs: the token dimension is marked dynamic for calls of more than one row,
so each method compiles at most two graphs (one row, any rows) whatever the
batch sizes a server sees; `graphs` lists what was compiled.

Inductor generates C++: without a C++ compiler (the riscv64 image, a bare
board) the policy runs the same routes eagerly and says so.
"""

from __future__ import annotations

import functools
import shutil
import threading
from typing import Any, Callable, Optional

import torch
from torch import nn

REGIONAL_ATTR = "rvv_regional_methods"


def cxx_compiler() -> Optional[str]:
    """The C++ compiler Inductor would use, or None."""
    from torch._inductor import config as inductor_config

    candidates = inductor_config.cpp.cxx
    for name in candidates if isinstance(candidates, (tuple, list)) else (candidates,):
        if name and shutil.which(name):
            return name
    return None


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules whose class names regional methods, in model order."""
    return [m for m in model.modules() if getattr(type(m), REGIONAL_ATTR, ())]


class RegionalCompile:
    """One compiled function per (block class, method), installed on every block."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, tuple[tuple[int, ...], ...]]] = []  # (method, input shapes)
        self._lock = threading.Lock()
        self._compiled: dict[tuple[type, str], Callable] = {}
        self._blocks: list[nn.Module] = []

    def attach(self, blocks: list[nn.Module]) -> None:
        for block in blocks:
            for method in getattr(type(block), REGIONAL_ATTR):
                compiled = self._compiled_for(type(block), method)
                block.__dict__[method] = functools.partial(_call_marking_rows, compiled, block)
            self._blocks.append(block)

    def detach(self) -> None:
        for block in self._blocks:
            for method in getattr(type(block), REGIONAL_ATTR):
                block.__dict__.pop(method, None)
        self._blocks.clear()

    def _compiled_for(self, cls: type, method: str) -> Callable:
        key = (cls, method)
        if key not in self._compiled:
            self._compiled[key] = torch.compile(getattr(cls, method), fullgraph=True,
                                                backend=functools.partial(self._inductor, f"{cls.__name__}.{method}"))
        return self._compiled[key]

    def _inductor(self, name: str, graph: torch.fx.GraphModule, example_inputs: list[Any]):
        from torch._inductor.compile_fx import compile_fx

        with self._lock:
            self.graphs.append((name, tuple(tuple(getattr(e, "shape", ())) for e in example_inputs
                                            if isinstance(e, torch.Tensor))))
        return compile_fx(graph, example_inputs)


def _call_marking_rows(compiled: Callable, block: nn.Module, *args: Any) -> Any:
    """Calls the compiled method with the token dimension of its inputs dynamic
    (one graph for any row count > 1; one row keeps its own, specialised one)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] > 1:
            torch._dynamo.mark_dynamic(a, 0)
    return compiled(block, *args)

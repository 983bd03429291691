"""The non-Linear kernels the policy routes, one row per kernel.

A model module declares which kernels it can use (`rvv_kernels = ("kv_pool_attention",)`
on its class); installing the policy hands such modules the model's
`KernelRoutes`, and at every call the module asks `routes.use(kind, ...)`:
True runs the kernel, False the module's own torch code, and either way the
call is counted with its reason. Adding a kernel adds a row to `KERNELS`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch

from rvascend.dispatch.counters import RouteCounters

ROUTES_ATTR = "_rvv_kernel_routes"


def bf16_cpu_inference(*tensors: torch.Tensor, prefill_keys: int = 0, fp32: bool = False) -> Optional[str]:
    """None for a BF16 CPU inference call (all FP32 too when `fp32`), else why not."""
    dtypes = (torch.bfloat16, torch.float32) if fp32 else (torch.bfloat16,)
    for t in tensors:
        if t.device.type != "cpu":
            return "non_cpu"
        if t.dtype not in dtypes or t.dtype != tensors[0].dtype:
            return "dtype"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "grad_required"
    return None


@functools.lru_cache(maxsize=None)
def _attention_kernel_has_block_form() -> bool:
    from rvascend.ops import attention_kernel_has_block_form

    return attention_kernel_has_block_form()


# The most K/V slots a prefill sequence may attend over for the row kernels
# (x86's AVX-512 and AVX2 sets, which have no block form) to take its query
# rows. Measured against SDPA's flash path (9 heads over 3 KV heads of 64, two
# threads): the rows are 1.3-2.0x faster up to 512 keys, and even to 10 %
# either way from 1024 on, where SDPA's GEMMs amortize what each row rereads.
ROW_KERNEL_PREFILL_KEYS = 512


def _kv_pool_attention(*tensors: torch.Tensor, prefill_keys: int = 0, fp32: bool = False) -> Optional[str]:
    why = bf16_cpu_inference(*tensors, fp32=fp32)
    if why is None and prefill_keys > ROW_KERNEL_PREFILL_KEYS and not _attention_kernel_has_block_form():
        return "long_prefill_without_block_kernel"
    return why


@dataclasses.dataclass(frozen=True)
class KernelKind:
    name: str
    gate: Callable[..., Optional[str]]  # (*tensors, prefill_keys=, fp32=) -> None, or why the torch path runs
    # Whether the kernel takes FP32 calls under deterministic inference, where the torch
    # path's result depends on the batch (attention: SDPA's blocks follow the query rows);
    # the others' torch code computes each row alone.
    fp32_invariant: bool = False


KERNELS: dict[str, KernelKind] = {k.name: k for k in (
    KernelKind("kv_pool_attention", _kv_pool_attention, fp32_invariant=True),
    KernelKind("rms_norm", bf16_cpu_inference),
    KernelKind("add_rms_norm", bf16_cpu_inference),
    KernelKind("rope", bf16_cpu_inference),
    KernelKind("silu_mul", bf16_cpu_inference),
    KernelKind("sigmoid_mul", bf16_cpu_inference),
    KernelKind("argmax", bf16_cpu_inference),
)}


class KernelRoutes:
    """One model's kernel routing: which kinds are on, and the counters. `batch_invariant`:
    no gate looks at the call's size (a long prompt's attention stays on the kernel), so
    a row takes the same kernels whatever it is batched with, and FP32 attention takes the
    kernel's FP32 form."""

    def __init__(self, enabled: bool, batch_invariant: bool = False) -> None:
        self.enabled = enabled
        self.batch_invariant = batch_invariant
        self.counters = RouteCounters()

    def gate(self, kind: str, *tensors: torch.Tensor, prefill_keys: int = 0) -> Optional[str]:
        """None if a call of `kind` takes the kernel, else why not."""
        if not self.enabled:
            return "kernels_off"
        k = KERNELS[kind]
        if self.batch_invariant:
            return k.gate(*tensors, prefill_keys=0, fp32=k.fp32_invariant)
        return k.gate(*tensors, prefill_keys=prefill_keys)

    def use(self, kind: str, *tensors: torch.Tensor, rows: int = 0, prefill_keys: int = 0) -> bool:
        """prefill_keys: when some sequence of the call has more than one query row,
        the most K/V slots any sequence of the call attends over; else 0."""
        why = self.gate(kind, *tensors, prefill_keys=prefill_keys)
        self.counters.record(kind, "kernel" if why is None else "fallback", rows, why)
        return why is None


def attach(model: torch.nn.Module, routes: KernelRoutes) -> list[torch.nn.Module]:
    """Hands `routes` to every module that declares kernels it can use; returns them."""
    attached = []
    for module in model.modules():
        kinds = getattr(type(module), "rvv_kernels", ())
        unknown = [k for k in kinds if k not in KERNELS]
        if unknown:
            raise ValueError(f"{type(module).__name__} declares unknown kernels {unknown}; known: {sorted(KERNELS)}")
        if kinds:
            module.__dict__[ROUTES_ATTR] = routes
            attached.append(module)
    return attached


def detach(modules: list[torch.nn.Module]) -> None:
    for module in modules:
        module.__dict__.pop(ROUTES_ATTR, None)


def routes_of(module: torch.nn.Module) -> Optional[KernelRoutes]:
    """The module's kernel routes; none while torch.compile traces, where
    Inductor fuses the same element-wise work into the graph itself."""
    if torch.compiler.is_compiling():
        return None
    return module.__dict__.get(ROUTES_ATTR)

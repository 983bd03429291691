"""The route of a projection whose weight stays quantized (models/quantized_layers.py).

Its quantized bytes are the weight of record and the kernels read them as they
are, so there is no second copy to pack, to budget or to go stale: the route
counts its calls (route "packed", as the BF16 routes count theirs) and sends
what the quantized kernels cannot take (input neither BF16 nor FP32, autograd) to the
module's dequantized product, with the reason counted. `invalidate_packed_weights`
and `repack` leave it as it is (there is nothing to drop or re-derive); a
weight replaced on the module is read at the next call.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import nn

from rvascend.dispatch.route_context import RouteContext

ROUTE_ATTR = "_rvv_route"


class QuantizedRoute:
    quantized = True

    def __init__(self, context: RouteContext, module: nn.Module, name: str, projection: str) -> None:
        self.context = context
        self._module = weakref.ref(module)
        self.name = name
        self.projection = projection

    def attach(self, forward: bool) -> None:
        del forward  # the module's own forward reaches the route (QuantizedLinear.forward)
        self._module().__dict__[ROUTE_ATTR] = self

    def detach(self) -> None:
        module = self._module()
        if module is not None:
            module.__dict__.pop(ROUTE_ATTR, None)

    def pack(self) -> int:
        return self._module().packed_bytes

    def drop(self, reason: str) -> None:
        del reason  # the quantized bytes are the weight: nothing is derived from them

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self._module()
        counters = self.context.counters
        rows = x.numel() // module.in_features if module.in_features else 0
        why: Optional[str] = None
        if x.device.type != "cpu":
            why = "non_cpu"
        elif x.dtype not in (torch.bfloat16, torch.float32):
            why = "input_dtype"
        elif torch.is_grad_enabled() and x.requires_grad:
            why = "grad_required"
        if why is not None:
            counters.record(self.projection, "fallback", rows, why)
            return module.dequantized_linear(x)
        counters.record(self.projection, "packed", rows)
        return module.quantized_linear(x)

"""One projection module's call path: gate, staleness check, bucket, packed or row-major.

Eagerly, a routed module's forward calls its `ProjectionRoute` directly. While
torch.compile traces (the policy's regional compile, or a user's own compile of
the model) the forward emits one opaque op, `rvascend::routed_linear`, whose
arguments are the input, the weight and bias as the module holds them, and the
route's id as a one-element buffer of the module. Buffers and parameters are
graph inputs, not constants, so one graph serves every layer; the op looks the
route up by id when the graph runs and makes the whole decision there, on the
real weight: a stale packed copy can never be baked into a graph.
"""

from __future__ import annotations

import itertools
import types
import weakref
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from rvascend import ops
from rvascend.policy import shape_gate
from rvascend.policy.packed_source import PackedWeightSource

if TYPE_CHECKING:
    from rvascend.policy.install import RvvPolicy

PACKED_BUFFER = "_rvv_packed_weight"
ROUTE_ID_BUFFER = "_rvv_route_id"
ROUTE_ATTR = "_rvv_route"

# Reasons a routed call runs the row-major callable by design (nothing stale).
_ROW_MAJOR_REASONS = ("not_packed", "packing_off", "not_packed_budget", "not_packable")

_ids = itertools.count()
_routes: "weakref.WeakValueDictionary[int, ProjectionRoute]" = weakref.WeakValueDictionary()


class ProjectionRoute:
    """Routes `module`'s linear calls; holds the module by weak reference only,
    so a model with the policy installed is freed like any other."""

    def __init__(self, policy: "RvvPolicy", module: nn.Module, name: str, projection: str) -> None:
        self._policy = weakref.ref(policy)
        self._module = weakref.ref(module)
        self.name = name
        self.projection = projection
        self.source: Optional[PackedWeightSource] = None
        self.unpacked_reason: Optional[str] = "not_packed"
        self.id = next(_ids)
        _routes[self.id] = self

    # -- installation -----------------------------------------------------------
    def attach(self, forward: bool) -> None:
        """Makes the module reach this route: by id (for traced calls) and, when
        `forward`, as its forward (an embedding doubling as a tied lm_head keeps
        its lookup and is reached through projection_linear)."""
        module = self._module()
        module.register_buffer(ROUTE_ID_BUFFER, torch.tensor(self.id, dtype=torch.int64), persistent=False)
        module.__dict__[ROUTE_ATTR] = self
        if forward:
            module.forward = types.MethodType(_routed_forward, module)

    def detach(self) -> None:
        self.drop("uninstalled")
        module = self._module()
        if module is None:
            return
        if getattr(module.__dict__.get("forward"), "__func__", None) is _routed_forward:
            del module.__dict__["forward"]
        module.__dict__.pop(ROUTE_ATTR, None)
        module._buffers.pop(ROUTE_ID_BUFFER, None)

    # -- packed state -----------------------------------------------------------
    def pack(self) -> int:
        """Packs the module's current weight into its non-persistent buffer; returns bytes."""
        module = self._module()
        weight = module.weight
        with torch.inference_mode(False), torch.no_grad():
            packed = ops.pack_bf16_weight(weight.detach())
        module.register_buffer(PACKED_BUFFER, packed, persistent=False)
        self.source = PackedWeightSource.capture(weight, ops.LAYOUT_VERSION)
        self.unpacked_reason = None
        return packed.numel() * packed.element_size()

    def drop(self, reason: str) -> None:
        """Frees the packed buffer; calls run row-major until an explicit repack."""
        module = self._module()
        if module is not None and PACKED_BUFFER in module._buffers:
            del module._buffers[PACKED_BUFFER]
        self.source = None
        self.unpacked_reason = reason

    def packed_weight(self, weight: torch.Tensor) -> tuple[Optional[torch.Tensor], Optional[str]]:
        """The packed buffer if it still matches `weight`, else (None, why not)."""
        if self.source is None:
            return None, self.unpacked_reason
        why = self.source.mismatch(weight)
        if why is None and self.source.layout_version != ops.LAYOUT_VERSION:
            why = "layout_version_changed"
        if why is not None:
            return None, why
        return self._module()._buffers[PACKED_BUFFER], None

    # -- calls ----------------------------------------------------------------
    # Never traced: the staleness check reads the weight's storage pointer,
    # version and content, which are only real when the call runs (traced calls
    # go through rvascend::routed_linear, which lands here at run time).
    @torch.compiler.disable
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self._module()
        policy = self._policy()
        weight = module.weight
        bias = getattr(module, "bias", None)
        k = weight.shape[-1]
        rows = x.numel() // k if k and x.shape[-1] == k else 0
        config = policy.config
        which = policy.shape_gate
        why = shape_gate.gate(self.projection, x, weight, bias, config.small_batch, which)
        if why is not None:
            policy.counters.record(self.projection, "fallback", rows, why)
            return F.linear(x, weight, bias)
        packed, unpacked = self.packed_weight(weight) if config.packed_weights else (None, "packing_off")
        if packed is None and unpacked not in _ROW_MAJOR_REASONS:
            # The packed copy is stale (or was invalidated): never use it.
            policy.counters.record(self.projection, "fallback", rows, unpacked)
            return F.linear(x, weight)
        if packed is None:
            policy.counters.record(self.projection, "row_major", rows, unpacked)
            return F.linear(x, weight)
        n = weight.shape[0]
        bucket = shape_gate.bucket_rows(rows, config.small_batch, which)
        x2 = x.reshape(rows, k)
        if bucket != rows:
            x2 = F.pad(x2, (0, 0, 0, bucket - rows))
        out = ops.packed_bf16_linear(x2, packed, n)
        policy.counters.record(self.projection, "packed", rows)
        if bucket != rows:
            out = out[:rows]
        return out.reshape(*x.shape[:-1], n)


@torch.library.custom_op("rvascend::routed_linear", mutates_args=())
def _routed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   route_id: torch.Tensor) -> torch.Tensor:
    route = _routes.get(int(route_id))
    module = route._module() if route is not None else None
    if module is None or module.weight is not weight or getattr(module, "bias", None) is not bias:
        # The graph was handed another weight than the route's module holds
        # (the policy was uninstalled, or the module's weight swapped while a
        # compiled graph still runs): the plain product of what it was given.
        return F.linear(x, weight, bias)
    return route(x)


@_routed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], route_id: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _routed_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward of a routed module."""
    if torch.compiler.is_compiling():
        return torch.ops.rvascend.routed_linear(x, module.weight, getattr(module, "bias", None),
                                                module._buffers[ROUTE_ID_BUFFER])
    return module.__dict__[ROUTE_ATTR](x)


def projection_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x @ module.weight.T (+ bias) through the module's route when the policy is installed.

    Engines call this for projections that are not plain nn.Linear modules,
    e.g. a tied lm_head that is the embedding module itself.
    """
    route = module.__dict__.get(ROUTE_ATTR)
    if getattr(route, "quantized", False):
        return route(x)
    if route is None:
        quantized = getattr(module, "quantized_linear", None)  # a quantized module (models/quantized_layers.py)
        if quantized is not None:
            return quantized(x)
        return F.linear(x, module.weight, getattr(module, "bias", None))
    return _routed_forward(module, x)

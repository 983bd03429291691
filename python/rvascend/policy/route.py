"""One projection module's call path: gate, staleness check, bucket, packed or row-major."""

from __future__ import annotations

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

# Reasons a routed call runs the row-major callable by design (nothing stale).
_ROW_MAJOR_REASONS = ("not_packed", "packing_off", "not_packed_budget", "not_packable")


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
    # Dynamo must not trace the route: the staleness check reads the weight's
    # storage pointer, version and content, which are only real in eager
    # execution (traced, they are evaluated once on fake tensors and a stale
    # packed copy would be baked into the graph). Inside an outer
    # torch.compile the route runs eagerly at every call, packed path included.
    @torch.compiler.disable
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self._module()
        policy = self._policy()
        weight = module.weight
        bias = getattr(module, "bias", None)
        k = weight.shape[-1]
        rows = x.numel() // k if k and x.shape[-1] == k else 0
        config = policy.config
        why = shape_gate.gate(self.projection, x, weight, bias, config.small_batch)
        if why is not None:
            policy.counters.record(self.projection, "fallback", rows, why)
            return F.linear(x, weight, bias)
        packed, unpacked = self.packed_weight(weight) if config.packed_weights else (None, "packing_off")
        if packed is None and unpacked not in _ROW_MAJOR_REASONS:
            # The packed copy is stale (or was invalidated): never use it.
            policy.counters.record(self.projection, "fallback", rows, unpacked)
            return F.linear(x, weight)
        n = weight.shape[0]
        bucket = shape_gate.bucket_rows(rows, config.small_batch)
        x2 = x.reshape(rows, k)
        if bucket != rows:
            x2 = F.pad(x2, (0, 0, 0, bucket - rows))
        if packed is not None:
            fn = policy.callable_for(x2, self.projection, bucket, n, k, "explicit_packed")
            out = fn(x2, packed, n)
            policy.counters.record(self.projection, "packed", rows)
        else:
            fn = policy.callable_for(x2, self.projection, bucket, n, k, "row_major")
            out = fn(x2, weight)
            policy.counters.record(self.projection, "row_major", rows, unpacked)
        if bucket != rows:
            out = out[:rows]
        return out.reshape(*x.shape[:-1], n)


def projection_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x @ module.weight.T (+ bias) through the module's route when the policy is installed.

    Engines call this for projections that are not plain nn.Linear modules,
    e.g. a tied lm_head that is the embedding module itself.
    """
    route = module.__dict__.get("_rvv_route")
    if route is None:
        return F.linear(x, module.weight, getattr(module, "bias", None))
    return route(x)

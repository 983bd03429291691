"""What a route reads of the policy that installed it, handed to it at install time.

The policy (rvascend.policy) makes one RouteContext per model and gives it to every
route (projection and quantized routes, the fused decoder); no route holds the policy.
All but the counters are fixed at install, as the policy's config is.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from rvascend.dispatch import weights_generation
from rvascend.dispatch.counters import RouteCounters
from rvascend.dispatch.kernel_routes import KernelRoutes


@dataclasses.dataclass(frozen=True)
class RouteContext:
    shape_gate: str            # "bucketed", "measured" or "invariant" (shape_gate.py)
    small_batch: bool          # M = 2..15 routed (bucketed to 2, 4, 8, 16)
    packed_weights: bool       # packed copies are made and used
    counters: RouteCounters    # per projection and route
    kernels: KernelRoutes      # the non-Linear kernels' routes
    model: "weakref.ReferenceType[torch.nn.Module]"

    def weights_changed(self) -> None:
        """A staleness check saw the model's weights change without a declaration (a
        `.data` write or swap): what was computed from the old ones and kept (the engine's
        prefix cache) is retired, as after a declared change."""
        model = self.model()
        if model is not None:
            weights_generation.bump(model)

"""The RVV policy layer (P4 + P5): installs the packed BF16 kernels into a loaded model.

Owns installing: packed-weight ownership (a non-persistent buffer per module),
reload invalidation, the tied lm_head check, the memory budget, the regional
compile of the decoder layer. What runs at call time (the routes and their
staleness checks, the shape gate, the fused step) is rvascend.dispatch, which
the models call. Engine-agnostic: a model family is described by an adapter.
"""

from rvascend.dispatch.counters import RouteCounters
from rvascend.dispatch.route import projection_linear
from rvascend.policy.config import RvvPolicyConfig
from rvascend.policy.install import (
    PolicyReport,
    RvvPolicy,
    get_policy,
    install_rvv_policy,
    invalidate_packed_weights,
    repack,
)

__all__ = [
    "PolicyReport",
    "RouteCounters",
    "RvvPolicy",
    "RvvPolicyConfig",
    "get_policy",
    "install_rvv_policy",
    "invalidate_packed_weights",
    "projection_linear",
    "repack",
]

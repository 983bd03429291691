"""The RVV policy layer (P4 + P5): installs the packed BF16 kernels into a loaded model.

Owns packed-weight ownership (a non-persistent buffer per module), staleness
detection and reload invalidation, the tied lm_head check, the memory budget,
the shape gate with its row buckets, the regional compile of the decoder layer and the route
counters. Engine-agnostic: a model family is described by an adapter.
"""

from rvascend.policy.config import RvvPolicyConfig
from rvascend.policy.counters import RouteCounters
from rvascend.policy.install import (
    PolicyReport,
    RvvPolicy,
    get_policy,
    install_rvv_policy,
    invalidate_packed_weights,
    repack,
)
from rvascend.policy.route import projection_linear

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

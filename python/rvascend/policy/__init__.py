"""The kernel policy layer (P4 + P5): installs the packed kernels (RVV, or AVX2 / AVX-512
on x86) into a loaded model.

Owns installing: packed-weight ownership (a non-persistent buffer per module),
reload invalidation, the tied lm_head check, the memory budget, the regional
compile of the decoder layer. What runs at call time (the routes and their
staleness checks, the shape gate, the fused step) is rvascend.dispatch, which
the models call. Engine-agnostic: a model family is described by an adapter.
"""

from rvascend.dispatch.counters import RouteCounters
from rvascend.dispatch.route import projection_linear
from rvascend.policy.config import KernelPolicyConfig
from rvascend.policy.install import (
    KernelPolicy,
    PolicyReport,
    get_policy,
    install_kernel_policy,
    invalidate_packed_weights,
    repack,
)

# The names from when the kernels were RVV's only, for code written against them.
RvvPolicy = KernelPolicy
RvvPolicyConfig = KernelPolicyConfig
install_rvv_policy = install_kernel_policy

__all__ = [
    "KernelPolicy",
    "KernelPolicyConfig",
    "PolicyReport",
    "RouteCounters",
    "get_policy",
    "install_kernel_policy",
    "invalidate_packed_weights",
    "projection_linear",
    "repack",
]

"""Torch custom ops backed by the project's kernels.

Owns the `torch.ops.rvascend.*` namespace: the op schemas, their CPU and fake
(meta) implementations, input validation, and the loading of the compiled
kernel extension. Importing this package registers the ops.
"""

from rvascend.ops.packed_linear import (
    BLOCK_N,
    LAYOUT_VERSION,
    available_kernel_sets,
    cpu_features,
    pack_bf16_weight,
    packed_bf16_linear,
    packed_weight_bytes,
    use_kernel_set,
)

from rvascend.ops.gated_delta_rule import recurrent_gated_delta_rule

__all__ = [
    "recurrent_gated_delta_rule",
    "BLOCK_N",
    "LAYOUT_VERSION",
    "available_kernel_sets",
    "cpu_features",
    "pack_bf16_weight",
    "packed_bf16_linear",
    "packed_weight_bytes",
    "use_kernel_set",
]

"""Torch custom ops backed by the project's kernels.

Owns the `torch.ops.rvascend.*` namespace: the op schemas, their CPU and fake
(meta) implementations, input validation, and the loading of the compiled
kernel extension. Importing this package registers the packed-linear ops;
importing `rvascend.ops.recurrent_gated_delta_rule` registers that op (its own
extension, on x86-64 hosts and in the riscv64 wheel alike).
"""

from rvascend.ops import elementwise, quantized_linear
from rvascend.ops.f32_linear import available_f32_linear_kernels, f32_linear
from rvascend.ops.kv_pool_attention import attention_kernel_has_block_form, available_attention_kernels, kv_pool_attention
from rvascend.ops.packed_linear import (
    BLOCK_N,
    LAYOUT_VERSION,
    WIDE_BLOCK_N,
    available_kernel_sets,
    cpu_features,
    kernel_set_layout_version,
    pack_bf16_weight,
    pack_bf16_weight_in_place,
    packed_bf16_linear,
    packed_weight_bytes,
    unpack_bf16_weight,
    use_kernel_set,
    weight_fingerprint,
)

__all__ = [
    "elementwise",
    "quantized_linear",
    "BLOCK_N",
    "LAYOUT_VERSION",
    "WIDE_BLOCK_N",
    "attention_kernel_has_block_form",
    "available_f32_linear_kernels",
    "available_attention_kernels",
    "available_kernel_sets",
    "cpu_features",
    "f32_linear",
    "kernel_set_layout_version",
    "kv_pool_attention",
    "pack_bf16_weight",
    "pack_bf16_weight_in_place",
    "packed_bf16_linear",
    "packed_weight_bytes",
    "unpack_bf16_weight",
    "use_kernel_set",
    "weight_fingerprint",
]

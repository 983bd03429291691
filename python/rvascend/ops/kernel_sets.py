"""Every kernel family's sets as this build has them and this CPU runs them, best first
(the first is the one used): what the server logs at start, so a slow host shows which
family fell to a portable set."""

from __future__ import annotations

from rvascend.ops import elementwise, quantized_linear
from rvascend.ops.f32_linear import available_f32_linear_kernels
from rvascend.ops.kv_pool_attention import available_attention_kernels
from rvascend.ops.packed_linear import available_kernel_sets


def available() -> dict[str, list[str]]:
    """Family -> its sets, best first."""
    out = {"bf16_linear": available_kernel_sets(), "f32_linear": available_f32_linear_kernels(),
           "quantized_linear": quantized_linear.available_quant_kernel_sets(),
           "attention": available_attention_kernels(), "elementwise": elementwise.available_elementwise_kernels()}
    try:
        from rvascend.ops import recurrent_gated_delta_rule
    except ImportError:  # an install without the DeltaNet extension: no hybrid model runs there either
        return out
    for dtype, short in (("bfloat16", "bf16"), ("float32", "f32")):
        out[f"deltanet_rows_{short}"] = recurrent_gated_delta_rule.available_row_kernels(dtype)
        out[f"deltanet_pieces_{short}"] = recurrent_gated_delta_rule.available_deltanet_pieces(dtype)
    return out


def describe() -> str:
    """One line: each family and its sets."""
    return "; ".join(f"{family} {', '.join(sets)}" for family, sets in available().items())

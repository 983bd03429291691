"""The start-up log names every kernel family's sets, each family's own list."""

from __future__ import annotations

from rvascend import ops
from rvascend.ops import recurrent_gated_delta_rule, kernel_sets


def test_every_family_is_listed_with_its_own_sets():
    sets = kernel_sets.available()
    assert list(sets) == ["bf16_linear", "f32_linear", "quantized_linear", "attention", "elementwise",
                          "deltanet_bf16", "deltanet_f32"]
    assert sets["bf16_linear"] == ops.available_kernel_sets()
    assert sets["quantized_linear"] == ops.quantized_linear.available_quant_kernel_sets()
    assert sets["deltanet_f32"] == recurrent_gated_delta_rule.available_row_kernels("float32")
    assert all(sets.values()), sets  # every family has at least its portable set
    line = kernel_sets.describe()
    assert all(f"{family} {', '.join(s)}" in line for family, s in sets.items())

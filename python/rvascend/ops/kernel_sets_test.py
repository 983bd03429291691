"""The start-up log names every kernel family's sets, each family's own list."""

from __future__ import annotations

from rvascend import ops
import pytest

from rvascend.ops import kernel_sets, recurrent_gated_delta_rule


def test_every_family_is_listed_with_its_own_sets():
    sets = kernel_sets.available()
    assert list(sets) == ["bf16_linear", "f32_linear", "quantized_linear", "attention", "elementwise",
                          "deltanet_rows_bf16", "deltanet_pieces_bf16", "deltanet_rows_f32", "deltanet_pieces_f32"]
    assert sets["bf16_linear"] == ops.available_kernel_sets()
    assert sets["quantized_linear"] == ops.quantized_linear.available_quant_kernel_sets()
    assert sets["deltanet_rows_f32"] == recurrent_gated_delta_rule.available_row_kernels("float32")
    assert sets["deltanet_pieces_bf16"] == recurrent_gated_delta_rule.available_deltanet_pieces("bfloat16")
    assert all(sets.values()), sets  # every family has at least its portable set
    line = kernel_sets.describe()
    assert all(f"{family} {', '.join(s)}" in line for family, s in sets.items())


def test_every_family_names_the_sets_there_are_when_one_is_not():
    """One selection for every family: a set this CPU or build lacks is refused naming the
    family and the sets there are."""
    from rvascend.ops.packed_linear import _native

    with pytest.raises(ValueError, match=r"attention kernel set 'nope' is not available .*\(available: .*portable"):
        _native.attention_kernel_has_block_form("nope")
    with pytest.raises(ValueError, match=r"deltanet pieces: dtype float16"):
        recurrent_gated_delta_rule.available_deltanet_pieces("float16")

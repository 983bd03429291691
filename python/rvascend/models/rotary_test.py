"""RotaryEmbedding's table of cos/sin rows: what it gathers equals what it computes,
across growth, per dtype."""

from __future__ import annotations

import types

import pytest
import torch

from rvascend.models.layers import RotaryEmbedding


def _rotary(dim: int = 64, theta: float = 1e6) -> RotaryEmbedding:
    return RotaryEmbedding(types.SimpleNamespace(rotary_dim=dim, rope_theta=theta, rope_scaling=None,
                                                 rope_freq_factors=None))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gathered_rows_equal_computed_rows_across_growth(dtype):
    rotary = _rotary()
    for positions in ([0], [3, 4, 5], [255], [256], [1000, 7], [5000, 0, 4999], list(range(300, 340))):
        p = torch.tensor(positions, dtype=torch.long)
        cos, sin = rotary(p, dtype)
        want_cos, want_sin = rotary.cos_sin(p, dtype)
        assert cos.dtype == dtype and cos.shape == (len(positions), 64)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), positions
    assert rotary._tables[dtype][0].shape[0] >= 5001


def test_each_dtype_has_its_own_table_and_empty_positions_work():
    rotary = _rotary(dim=32)
    cos16, _ = rotary(torch.tensor([10]), torch.bfloat16)
    cos32, _ = rotary(torch.tensor([10]), torch.float32)
    assert cos16.dtype == torch.bfloat16 and cos32.dtype == torch.float32
    assert torch.equal(cos16, cos32.to(torch.bfloat16))
    empty_cos, empty_sin = rotary(torch.empty(0, dtype=torch.long), torch.bfloat16)
    assert empty_cos.shape == (0, 32) and empty_sin.shape == (0, 32)

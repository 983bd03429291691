"""The elementwise kernels' Qwen3.5 forms against transformers' own Qwen3.5 code (host only:
the riscv64 image has no transformers; models/elementwise_test covers the same kernels there)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from rvascend import ops
from rvascend.ops.testing import assert_rope_close, qwen3_5_query_case, ulps

E = ops.elementwise


@pytest.mark.parametrize("rows,d", [(1, 1024), (4, 576), (3, 7), (2, 3000)])
def test_zero_centred_norm_matches_transformers_qwen3_5(rows, d):
    """Qwen3_5RMSNorm scales by 1 + w in FP32 and rounds once."""
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(rows, d, generator=g) * 3).bfloat16()
    r = torch.randn(rows, d, generator=g).bfloat16()
    w = (0.3 * torch.randn(d, generator=g)).bfloat16()
    theirs = hf.Qwen3_5RMSNorm(d, 1e-6).bfloat16()
    with torch.no_grad():
        theirs.weight.copy_(w)
        want, want_add = theirs(x), theirs(x + r)
    got = E.rms_norm(x, w, 1e-6, zero_centred=True)
    got_add, _ = E.add_rms_norm(x, r, w, 1e-6, zero_centred=True)
    # One rounding: at most 1 ulp from theirs where the FP32 statistics differ in the last bit.
    assert ulps(got, want).max() <= 1 and ulps(got_add, want_add).max() <= 1
    assert (got != want).float().mean() < 0.01 and (got_add != want_add).float().mean() < 0.01


@pytest.mark.parametrize("heads,d,rotary_dim", [(8, 256, 64), (4, 64, 16), (2, 32, 32)])
def test_rope_matches_transformers_qwen3_5_gated_query(heads, d, rotary_dim):
    """Qwen3_5RMSNorm on the query half of each gated head, then apply_rotary_pos_emb on its
    first rotary_dim values (partial RoPE)."""
    qg, weight, cos, sin = qwen3_5_query_case(heads, d, rotary_dim)
    t = qg.shape[0]
    norm = hf.Qwen3_5RMSNorm(d, eps=1e-6).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(weight)
        normed = norm(qg.reshape(t, heads, 2 * d)[..., :d]).transpose(0, 1)  # [heads, t, d]
        want, _ = hf.apply_rotary_pos_emb(normed, normed, cos, sin, unsqueeze_dim=0)
    got = E.rope(qg, heads, weight, 1e-6, cos, sin, zero_centred=True, head_dim=d)
    assert_rope_close(got, want.transpose(0, 1), rotary_dim)

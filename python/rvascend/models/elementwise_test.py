"""The elementwise ops against the torch code they replace (the model's own
layers, torch's F.silu / rsqrt / cat) and FP64 statements of their contracts."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from rvascend import ops
from rvascend.models.layers import RMSNorm, apply_rotary, silu_and_mul
from rvascend.ops.testing import assert_rope_close, qwen3_5_query_case, ulps as _ulps

E = ops.elementwise


def _torch_norm(d: int, eps: float, weight: torch.Tensor) -> RMSNorm:
    norm = RMSNorm(d, eps).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("rows,d", [(1, 1024), (4, 576), (3, 7), (2, 3000)])
def test_rms_norm_and_add_rms_norm_match_the_torch_layer(rows, d):
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(rows, d, generator=g) * 3).bfloat16()
    r = torch.randn(rows, d, generator=g).bfloat16()
    w = (1 + 0.3 * torch.randn(d, generator=g)).bfloat16()
    norm = _torch_norm(d, 1e-6, w)
    with torch.no_grad():
        want = norm(x)
        want_sum = x + r
        want_add = norm(want_sum)
    got = E.rms_norm(x, w, 1e-6)
    got_add, got_sum = E.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(got_sum, want_sum)                 # one BF16 rounding of the sum, like torch
    assert _ulps(got, want).max() <= 1 and _ulps(got_add, want_add).max() <= 1
    assert (got != want).float().mean() < 0.01             # the same roundings: nearly bit-identical
    exact = w.double() * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert _ulps(got, exact).max() <= 2


@pytest.mark.parametrize("rows,d", [(1, 1024), (4, 576), (3, 7), (2, 3000)])
def test_zero_centred_norm_rounds_once(rows, d):
    """Qwen3.5's norms scale by 1 + w in FP32 and round once: within half an ulp (and FP32
    slack) of FP64. transformers' own layer is compared in elementwise_transformers_test
    (the riscv64 image runs this file and has no transformers)."""
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(rows, d, generator=g) * 3).bfloat16()
    r = torch.randn(rows, d, generator=g).bfloat16()
    w = (0.3 * torch.randn(d, generator=g)).bfloat16()
    got = E.rms_norm(x, w, 1e-6, zero_centred=True)
    got_add, got_sum = E.add_rms_norm(x, r, w, 1e-6, zero_centred=True)
    assert torch.equal(got_sum, x + r)
    for out, inp in ((got, x), (got_add, got_sum)):
        exact = (1 + w.double()) * inp.double() * torch.rsqrt(inp.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        assert _ulps(out, exact).max() <= 0.51
    plain = E.rms_norm(x, w, 1e-6)  # the flag changes the answer
    assert not torch.equal(plain, got)


def test_silu_mul_matches_torch():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 2 * 3072, generator=g) * 4).bfloat16()
    x[0, :4] = torch.tensor([-100.0, 90.0, 0.0, -0.0]).bfloat16()
    want = silu_and_mul(x)
    got = E.silu_mul(x)
    assert _ulps(got, want).max() <= 1 and (got != want).float().mean() < 0.01
    gate, up = x.double().chunk(2, -1)
    assert _ulps(got, F.silu(gate) * up).max() <= 2


@pytest.mark.parametrize("heads,d,norm", [(16, 128, True), (8, 128, True), (32, 64, False), (3, 6, True)])
def test_rope_matches_the_model_path(heads, d, norm):
    g = torch.Generator().manual_seed(heads * d)
    t, extra = 5, 3 * d
    qkv = torch.randn(t, heads * d + extra, generator=g).bfloat16()
    x = qkv[:, :heads * d]  # a slice of the wider qkv row, as the model passes it
    angles = torch.rand(t, d // 2, generator=g) * 6
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    w = (1 + 0.2 * torch.randn(d, generator=g)).bfloat16()
    ref = x.reshape(t, heads, d)
    if norm:
        with torch.no_grad():
            ref = _torch_norm(d, 1e-6, w)(ref)
    want = apply_rotary(ref, cos, sin)
    got = E.rope(x, heads, w if norm else None, 1e-6, cos, sin)
    assert got.shape == (t, heads, d)
    assert (got.double() - want.double()).abs().max() <= 2 * torch.finfo(torch.bfloat16).eps * want.abs().max()
    assert (got != want).float().mean() < 0.02


@pytest.mark.parametrize("heads,d,rotary_dim", [(8, 256, 64), (4, 64, 16), (2, 32, 32)])
def test_rope_partial_zero_centred_on_a_gated_query(heads, d, rotary_dim):
    """Qwen3.5's query path: zero-centred q norm, RoPE on the first rotary_dim values, read in
    place from the gated query (each head beside its gate, 2d apart) of a wider qkv row;
    against the model's torch path (rounded once after the norm, as that path does)."""
    qg, norm_weight, cos, sin = qwen3_5_query_case(heads, d, rotary_dim)
    t = qg.shape[0]
    query = qg.reshape(t, heads, 2 * d)[..., :d].float()
    normed = (query * torch.rsqrt(query.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm_weight.float())).bfloat16()
    want = torch.cat((apply_rotary(normed[..., :rotary_dim], cos, sin), normed[..., rotary_dim:]), -1)
    got = E.rope(qg, heads, norm_weight, 1e-6, cos, sin, zero_centred=True, head_dim=d)
    assert got.shape == (t, heads, d)
    assert_rope_close(got, want, rotary_dim)


@pytest.mark.parametrize("heads,d", [(8, 256), (3, 7), (1, 64)])
def test_sigmoid_mul_matches_the_gated_attention_output(heads, d):
    """Qwen3.5's output gate: out * sigmoid(gate) in BF16, the gate read in place beside each
    head's query (heads 2d apart in the wider qkv row)."""
    g = torch.Generator().manual_seed(heads * d)
    t = 4
    qkv = (3 * torch.randn(t, heads * 2 * d + 5, generator=g)).bfloat16()
    x = torch.randn(t, heads * d, generator=g).bfloat16()
    qkv[0, d] = -100.0  # exp overflow side
    qkv[1, d] = 90.0
    gate = qkv[:, :heads * 2 * d].reshape(t, heads, 2 * d)[..., d:].reshape(t, heads * d)
    want = x * torch.sigmoid(gate)
    got = E.sigmoid_mul(x, qkv[:, d:], heads, 2 * d)
    assert got.shape == want.shape
    # Nearly bit-identical: at most 1 % of the values, or the overflow side's one (the kernel's
    # exp saturates, so sigmoid(-100) is a denormal where torch's is 0).
    assert _ulps(got, want).max() <= 1 and int((got != want).sum()) <= max(1, want.numel() // 100)
    assert _ulps(got, x.double() * torch.sigmoid(gate.double())).max() <= 2


def test_argmax_matches_torch_and_flags_nan():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 151936, generator=g).bfloat16()
    x[2, 7] = x[2, 100] = 50  # tie: the first index, as torch.argmax
    assert torch.equal(E.argmax(x), torch.argmax(x, dim=-1))
    x[1, 5] = float("nan")
    got = E.argmax(x)
    assert got[1] == -1 and got[0] == torch.argmax(x[0])


@pytest.mark.parametrize("call,error,match", [
    (lambda: E.rms_norm(torch.zeros(2, 4), torch.ones(4).bfloat16(), 1e-6), TypeError, "x must be bfloat16"),
    (lambda: E.rms_norm(torch.zeros(2, 4).bfloat16(), torch.ones(5).bfloat16(), 1e-6), ValueError, "does not match"),
    (lambda: E.add_rms_norm(torch.zeros(2, 4).bfloat16(), torch.zeros(3, 4).bfloat16(), torch.ones(4).bfloat16(),
                            1e-6), ValueError, "residual"),
    (lambda: E.silu_mul(torch.zeros(2, 5).bfloat16()), ValueError, "even"),
    (lambda: E.rope(torch.zeros(2, 12).bfloat16(), 5, None, 0.0, torch.zeros(2, 2).bfloat16(),
                    torch.zeros(2, 2).bfloat16()), ValueError, "heads"),
    (lambda: E.rope(torch.zeros(2, 12).bfloat16(), 2, None, 0.0, torch.zeros(2, 5).bfloat16(),
                    torch.zeros(2, 5).bfloat16()), ValueError, "cos/sin"),
    (lambda: E.rope(torch.zeros(2, 16).bfloat16(), 2, None, 0.0, torch.zeros(2, 6).bfloat16(),
                    torch.zeros(2, 6).bfloat16(), head_dim=4), ValueError, "rotary_dim even and at most"),
    (lambda: E.rope(torch.zeros(2, 16).bfloat16(), 2, None, 0.0, torch.zeros(2, 4).bfloat16(),
                    torch.zeros(2, 4).bfloat16(), head_dim=9), ValueError, "head_dim 9"),
    (lambda: E.sigmoid_mul(torch.zeros(2, 8).bfloat16(), torch.zeros(2, 7).bfloat16(), 2, 4), ValueError,
     "gate must be"),
    (lambda: E.sigmoid_mul(torch.zeros(2, 8).bfloat16(), torch.zeros(2, 16).bfloat16(), 2, 3), ValueError,
     "gate must be"),
    (lambda: E.argmax(torch.zeros(2, 0).bfloat16()), ValueError, "n > 0"),
])
def test_bad_input_is_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_ops_trace_under_torch_compile():
    x = torch.randn(2, 64).bfloat16()
    w = torch.ones(64).bfloat16()

    def f(x, w):
        n, s = E.add_rms_norm(x, x, w, 1e-6)
        return E.silu_mul(torch.cat([n, s], -1)), E.argmax(n)
    want = f(x, w)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_native_entry_points_check_their_own_extents():
    """Each buffer crosses with the elements readable from its pointer; a bypassed op
    check (a caller of the binding itself) is a ValueError naming the buffer, not a
    read past the end."""
    from rvascend.ops.packed_linear import _native
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    out = torch.empty(4, 64, dtype=torch.bfloat16)
    idx = torch.empty(4, dtype=torch.int64)
    cos = torch.zeros(4, 16, dtype=torch.bfloat16)
    p = lambda t: t.data_ptr()  # noqa: E731
    calls = {
        "x": lambda: _native.rms_norm(4, 64, p(x), 64, 200, 0, 64, 0, p(w), 64, 1e-6, False, p(out), 256, 0, 0, 1),
        "weight": lambda: _native.rms_norm(4, 64, p(x), 64, 256, 0, 64, 0, p(w), 32, 1e-6, False, p(out), 256, 0, 0,
                                           1),
        "out": lambda: _native.silu_mul(4, 32, p(x), 64, 256, p(out), 100, 1),
        "cos and sin": lambda: _native.rope(4, 2, 32, 32, 16, p(x), 64, 256, 0, 0, 1e-6, False, p(cos), p(cos), 32,
                                            p(out), 256, 1),
        "gate": lambda: _native.sigmoid_mul(4, 2, 16, p(x), 32, 256, p(x), 64, 48, 100, p(out), 256, 1),
        "argmax out": lambda: _native.argmax(4, 64, p(x), 64, 256, p(idx), 3, 1),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=name.split()[-1] if name == "argmax out" else name):
            call()
    with pytest.raises(ValueError, match="overflows a 64-bit size"):
        _native.silu_mul(4, 2**63, p(x), 64, 256, p(out), 256, 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""f32_linear against F.linear (FP64), row by row bit for bit at every M, and its errors."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from rvascend import ops


@pytest.mark.parametrize("n,k,bias", [(70, 67, False), (130, 256, True), (1100, 300, False)])
def test_matches_fp64_and_each_row_is_its_row_alone(n, k, bias):
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(17, k + 5, generator=g)[:, :k]  # strided rows
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    alone = torch.cat([ops.f32_linear(x[r:r + 1], w, b) for r in range(17)])
    want = F.linear(x.double(), w.double(), b.double() if bias else None)
    bound = (k + 2) * 2.0**-23 * F.linear(x.double().abs(), w.double().abs(), b.double().abs() if bias else None)
    assert ((alone.double() - want).abs() <= bound).all()
    for m in range(1, 18):
        assert torch.equal(ops.f32_linear(x[:m], w, b), alone[:m]), m
    # Leading dimensions are kept.
    assert torch.equal(ops.f32_linear(x[:6].reshape(2, 3, k), w, b), alone[:6].reshape(2, 3, n))


def test_a_set_is_chosen():
    sets = ops.available_f32_linear_kernels()
    assert sets and sets[-1] == "portable"


@pytest.mark.parametrize("args,error,match", [
    (lambda x, w: (x.bfloat16(), w, None), TypeError, "input must be float32"),
    (lambda x, w: (x, w.double(), None), TypeError, "weight must be float32"),
    (lambda x, w: (x[:, :5], w, None), ValueError, "not the weight's K = 8"),
    (lambda x, w: (x, w[None], None), ValueError, "weight must be 2-D"),
    (lambda x, w: (x, w, torch.zeros(3)), ValueError, "bias has shape \\(3,\\)"),
])
def test_bad_input_is_a_clear_error(args, error, match):
    with pytest.raises(error, match=match):
        ops.f32_linear(*args(torch.randn(2, 8), torch.randn(4, 8)))


def test_traces_under_torch_compile():
    x, w = torch.randn(3, 16), torch.randn(5, 16)
    fn = torch.compile(lambda a, b: ops.f32_linear(a, b), fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(x, w), ops.f32_linear(x, w))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

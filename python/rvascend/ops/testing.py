"""Shared pieces of the ops tests (the riscv64 image runs some of them, the host all)."""

from __future__ import annotations

import torch


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in BF16 ulps of want."""
    want = want.double()
    ulp = torch.ldexp(torch.ones_like(want), torch.frexp(want.abs().clamp_min(1e-30))[1] - 8)
    return (got.double() - want).abs() / ulp


def qwen3_5_query_case(heads: int, d: int, rotary_dim: int, tokens: int = 5
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gated query [tokens, heads * 2d], a slice of a wider qkv row; zero-centred norm weight [d];
    cos, sin [tokens, rotary_dim]), BF16."""
    g = torch.Generator().manual_seed(heads * d + rotary_dim)
    qkv = torch.randn(tokens, heads * 2 * d + 3 * d, generator=g).bfloat16()
    angles = torch.rand(tokens, rotary_dim // 2, generator=g) * 6
    emb = torch.cat((angles, angles), -1)
    weight = (0.3 * torch.randn(d, generator=g)).bfloat16()
    return qkv[:, :heads * 2 * d], weight, emb.cos().bfloat16(), emb.sin().bfloat16()


def assert_rope_close(got: torch.Tensor, want: torch.Tensor, rotary_dim: int) -> None:
    """The rope kernel's output against a torch statement of the same roundings: the values
    past rotary_dim (the normed head) within an ulp, the rotated ones within two BF16 epsilons
    of the largest value, and nearly all bit-identical."""
    if rotary_dim < got.shape[-1]:
        assert ulps(got[..., rotary_dim:], want[..., rotary_dim:]).max() <= 1
    assert (got.double() - want.double()).abs().max() <= 2 * torch.finfo(torch.bfloat16).eps * want.abs().max()
    assert (got != want).float().mean() < 0.02

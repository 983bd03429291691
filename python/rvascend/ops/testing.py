"""Shared pieces of the ops tests (the riscv64 image runs some of them, the host all)."""

from __future__ import annotations

import ctypes
import mmap

import torch
import torch.nn.functional as F

from rvascend import ops


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


def pack_reference(w: torch.Tensor, layout_version: int = 1, b: int = 0) -> torch.Tensor:
    """W [N, K] packed as the layout's definition says (packed_linear.py), written without
    the kernels: block b (default: this machine's for the version)."""
    n, k = w.shape
    b = b or (32 if layout_version == 1 else ops.WIDE_BLOCK_N)
    padded = -(-n // b) * b
    blocks = F.pad(w, (0, 0, 0, padded - n)).reshape(padded // b, b, k)
    if layout_version == 2:  # lanes 2t, 2t+1 hold columns t and B/2 + t
        blocks = torch.stack([blocks[:, : b // 2], blocks[:, b // 2:]], dim=2).reshape(padded // b, b, k)
    return blocks.permute(0, 2, 1).contiguous()


def vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address`."""
    with open("/proc/self/smaps", encoding="ascii") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def thp_advice_recorded() -> bool:
    """Whether this process's madvise(MADV_HUGEPAGE) reaches a kernel that records the
    advice: a mapping of Python's own, advised so (QEMU's user mode, where the riscv64
    image runs, answers the call and does nothing)."""
    with mmap.mmap(-1, 8 << 20) as probe:
        probe.madvise(mmap.MADV_HUGEPAGE)
        view = (ctypes.c_char * len(probe)).from_buffer(probe)
        recorded = "hg" in vm_flags(ctypes.addressof(view) + (4 << 20))
        del view
    return recorded

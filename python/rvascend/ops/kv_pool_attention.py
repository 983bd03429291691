"""`torch.ops.rvascend.kv_pool_attention`: attention that reads K/V in place from the KV pool.

Writes the new tokens' K and V into the pool (in place, at `write_slots`),
then computes, for every sequence b and query row r, softmax(q k^T * scale) v
over the sequence's slots `kv_slots[kv_starts[b]:kv_starts[b+1]]`, causally
(a sequence with n query rows and L slots: row r attends to its first
L - n + r + 1 slots). GQA by index: query head h reads KV head
h // (heads / kv_heads); nothing is gathered or repeated. FP32 inside, one
BF16 rounding of the output. All-FP32 tensors (an FP32 model under deterministic
inference) run every query row alone, so a row's result never depends on its batch.
"""

from __future__ import annotations

import torch

from rvascend.ops.packed_linear import _native, eager_call, register_fake

torch.library.define(
    "rvascend::kv_pool_attention",
    "(Tensor q, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor k_new, Tensor v_new, Tensor write_slots, "
    "Tensor kv_slots, Tensor kv_starts, Tensor q_starts, float scale) -> Tensor")


def available_attention_kernels() -> list[str]:
    return list(_native.available_attention_kernels())


def attention_kernel_has_block_form(kernel: str = "") -> bool:
    """Whether `kernel` (default: the one the op runs) computes a prefill's rows as
    blocks; without one, every prefill row rereads its sequence's K/V."""
    return bool(_native.attention_kernel_has_block_form(kernel))


def _check(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
           write_slots: torch.Tensor, kv_slots: torch.Tensor, kv_starts: torch.Tensor, q_starts: torch.Tensor) -> None:
    name = "kv_pool_attention"
    if q.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"{name}: q must be bfloat16 or float32, got {q.dtype}")
    for what, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("k_new", k_new), ("v_new", v_new)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: {what} must be {q.dtype} like q, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name}: {what} must be 3-D, got shape {tuple(t.shape)}")
    for what, t in (("write_slots", write_slots), ("kv_slots", kv_slots), ("kv_starts", kv_starts),
                    ("q_starts", q_starts)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise TypeError(f"{name}: {what} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    slots, kv_heads, d = k_pool.shape
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"{name}: v_pool {tuple(v_pool.shape)} differs from k_pool {tuple(k_pool.shape)}")
    t, heads, qd = q.shape
    if qd != d:
        raise ValueError(f"{name}: q has head_dim {qd}, the pool {d}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{name}: {heads} query heads are not a multiple of {kv_heads} KV heads")
    for what, new in (("k_new", k_new), ("v_new", v_new)):
        if tuple(new.shape[1:]) != (kv_heads, d) or new.shape[0] != write_slots.shape[0]:
            raise ValueError(f"{name}: {what} has shape {tuple(new.shape)}, expected "
                             f"[{write_slots.shape[0]}, {kv_heads}, {d}] (one row per write slot)")
    if kv_starts.shape != q_starts.shape or kv_starts.shape[0] < 1:
        raise ValueError(f"{name}: kv_starts and q_starts must both have batch + 1 entries")
    # Where q_starts and kv_starts end is checked by the native op (reading a tensor
    # element from Python costs more than the whole check there).


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _attention_cpu(q, k_pool, v_pool, k_new, v_new, write_slots, kv_slots, kv_starts, q_starts, scale):
    _check(q, k_pool, v_pool, k_new, v_new, write_slots, kv_slots, kv_starts, q_starts)
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("kv_pool_attention: the pools must be contiguous (they are written in place)")
    slots, kv_heads, d = k_pool.shape
    write_slots, kv_slots = _contiguous(write_slots), _contiguous(kv_slots)
    kv_starts, q_starts = _contiguous(kv_starts), _contiguous(q_starts)
    k_new, v_new = _contiguous(k_new), _contiguous(v_new)
    t, heads, _ = q.shape
    q = _contiguous(q)
    out = torch.empty_like(q)
    _native.kv_pool_attention("", q_starts.shape[0] - 1, q_starts.data_ptr(), q_starts.numel(), t,
                              kv_starts.data_ptr(), kv_starts.numel(), kv_slots.data_ptr(), kv_slots.shape[0],
                              heads, kv_heads, d, q.data_ptr(), heads * d, q.numel(), k_pool.data_ptr(),
                              v_pool.data_ptr(), slots, min(k_pool.numel(), v_pool.numel()), k_new.data_ptr(),
                              v_new.data_ptr(), min(k_new.numel(), v_new.numel()), write_slots.data_ptr(),
                              write_slots.shape[0], float(scale), out.data_ptr(), heads * d, out.numel(),
                              torch.get_num_threads(), q.dtype == torch.float32)
    return out


torch.library.impl("rvascend::kv_pool_attention", "CPU")(_attention_cpu)


@register_fake("rvascend::kv_pool_attention")
def _attention_fake(q, k_pool, v_pool, k_new, v_new, write_slots, kv_slots, kv_starts, q_starts, scale):
    return torch.empty_like(q)


def kv_pool_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, k_new: torch.Tensor,
                      v_new: torch.Tensor, write_slots: torch.Tensor, kv_slots: torch.Tensor,
                      kv_starts: torch.Tensor, q_starts: torch.Tensor, scale: float) -> torch.Tensor:
    """[T, heads, D] attention output; k_new/v_new are written into the pools first."""
    return eager_call(torch.ops.rvascend.kv_pool_attention, _attention_cpu, q, k_pool, v_pool, k_new, v_new,
                      write_slots, kv_slots, kv_starts, q_starts, scale)

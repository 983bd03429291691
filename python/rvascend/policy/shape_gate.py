"""The shape gate (the seed's, exactly) and the row buckets.

A call is routed to the RVV path only if: CPU; BF16 input and weight; 2-D
after flattening leading dims; no bias; N >= 1024; K >= 1024;
M*N*K >= 1,000,000; no gradient needed; and M = 1, or M = 2..15 with small batches on (lm_head
included), or M = 16..128 for projections other than lm_head. Anything else
runs plain F.linear on the row-major weight, and the reason is counted.
"""

from __future__ import annotations

from typing import Optional

import torch

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
MIN_FEATURES = 1024
MIN_MACS = 1_000_000
SMALL_BATCH_BUCKETS = (2, 4, 8, 16)
PREFILL_BUCKETS = (16, 32, 64, 128)


def gate(projection: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
         small_batch: bool) -> Optional[str]:
    """None if the call may take the RVV path, else the fallback reason."""
    why = _shape_gate(projection, x, weight, bias, small_batch)
    # The packed op has no backward: a call autograd must differentiate runs
    # F.linear, which does.
    if why is None and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return "grad_required"
    return why


def _shape_gate(projection: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                small_batch: bool) -> Optional[str]:
    if x.device.type != "cpu" or weight.device.type != "cpu":
        return "non_cpu"
    if x.dtype != torch.bfloat16:
        return "input_dtype"
    if weight.dtype != torch.bfloat16:
        return "weight_dtype"
    if weight.dim() != 2 or x.dim() < 1:
        return "rank"
    if bias is not None:
        return "bias"
    n, k = weight.shape
    if x.shape[-1] != k:
        return "rank"
    if n < MIN_FEATURES or k < MIN_FEATURES:
        return "small_features"
    m = x.numel() // k if k else 0
    if m * n * k < MIN_MACS:
        return "small_macs"
    if m == 1:
        return None
    if 2 <= m <= 15:
        return None if small_batch else "small_batch_off"
    if 16 <= m <= 128:
        return "lm_head_prefill_rows" if projection == "lm_head" else None
    return "rows_out_of_range"


def bucket_rows(m: int, small_batch: bool) -> int:
    """The row count a call of m rows is padded to (m = 3 runs the 4-row callable)."""
    if m == 1:
        return 1
    buckets = SMALL_BATCH_BUCKETS + PREFILL_BUCKETS[1:] if small_batch else PREFILL_BUCKETS
    for b in buckets:
        if m <= b:
            return b
    raise ValueError(f"{m} rows exceed the largest bucket ({buckets[-1]})")


def bucket_set(small_batch: bool) -> tuple[int, ...]:
    return (1,) + (SMALL_BATCH_BUCKETS + PREFILL_BUCKETS[1:] if small_batch else PREFILL_BUCKETS)

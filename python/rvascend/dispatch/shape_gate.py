"""The shape gates and the row buckets.

Three gates, chosen by `--cpu-kernels-shape-gate` (default: `measured`), and shown
in the start-up log and the route counters (every call records which gate let
it through or not):

- seed (the seed's contract, for its x86-tuned Inductor path): a call is routed
  only if CPU; BF16 input and weight; 2-D after flattening leading dims; no
  bias; N >= 1024; K >= 1024; M*N*K >= 1,000,000; and M = 1, or M = 2..15 with
  small batches on (lm_head included), or M = 16..128 for projections other
  than lm_head. Rows are padded to buckets (1; 2, 4, 8, 16; 16..128).
- measured: the same type checks, then the packed kernel wherever it beat
  F.linear at the nearest point of a measured grid. On riscv64 the grid counts
  instructions in the image (gate_riscv64.json, written by
  bench/image_instruction_count.py --grid: F.linear is scalar ATen there, about
  30 instructions per multiply-add); elsewhere it is timed on the host itself
  per weight shape (host_gate.py), since which side wins depends on the host. Any N, K
  and M; no padding (the routes run eagerly or as one opaque op, so no shape
  needs its own graph).

- invariant (--enable-deterministic-inference): the same type checks, then the
  packed kernel for every BF16 projection at every M. A call's route never
  depends on its row count, so a row's result does not depend on what it is
  batched with (the packed kernels give each row the same K order at every M,
  GEMV or GEMM tile: rvv_kernels/linear/tests). No padding.

Anything else runs plain F.linear on the row-major weight, and the reason is counted.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
from typing import Optional

import torch

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
MIN_FEATURES = 1024
MIN_MACS = 1_000_000
SMALL_BATCH_BUCKETS = (2, 4, 8, 16)
PREFILL_BUCKETS = (16, 32, 64, 128)
GATES = ("bucketed", "measured", "invariant")
# The gate's earlier name (it restates the seed document's contract), still accepted.
_ALIASES = {"seed": "bucketed"}
RISCV64_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate_riscv64.json")
# The riscv64 table's grid (bench/image_instruction_count.py --grid counts it): the
# widths of the small models people run on boards (SmolLM2-135M: 576, 192 for its K/V,
# 1536), powers of two around them, and the rows of decode steps, small batches and
# prefill chunks.
RISCV64_GRID_N = (64, 192, 576, 1024, 1536)
RISCV64_GRID_K = (64, 576, 1024, 1536)
RISCV64_GRID_M = (1, 4, 16)
# The measured gate's table file; None: this host's timed table (host_gate.py).
_TABLE: Optional[str] = RISCV64_TABLE if platform.machine() == "riscv64" else None


def default_gate() -> str:
    """`invariant` on riscv64: its measured grid (gate_riscv64.json) has the packed kernel
    cheaper than scalar ATen at every point, so the measured gate takes the same routes,
    and the invariant one guarantees them whatever the rows (batch-invariant answers at no
    cost). `measured` elsewhere, where the host's timings may prefer F.linear for some
    shapes. The seed's gate stays selectable (`bucketed`), but on riscv64 its shapes
    refuse every small model, and on x86 its refusals cost the fused decode step
    (measured: 1.7x slower decode for SmolLM2 on an AVX2 host)."""
    return "invariant" if platform.machine() == "riscv64" else "measured"


def resolve(gate: Optional[str]) -> str:
    gate = _ALIASES.get(gate, gate) or default_gate()
    if gate not in GATES:
        raise ValueError(f"--cpu-kernels-shape-gate must be one of {', '.join(GATES)}, got {gate!r}")
    return gate


def gate(projection: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
         small_batch: bool, which: str = "bucketed") -> Optional[str]:
    """None if the call may take the packed path, else the fallback reason."""
    why = _type_gate(x, weight, bias)
    if why is None:
        n, k = weight.shape
        why = rows_gate(projection, x.numel() // k if k else 0, n, k, small_batch, which)
    # The packed op has no backward: a call autograd must differentiate runs
    # F.linear, which does.
    if why is None and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return "grad_required"
    return why


# The gate's reasons that mean the packed kernel cannot take the call at all (_type_gate's,
# and autograd); the others only say F.linear measured or was contracted faster.
UNSUPPORTED = ("non_cpu", "input_dtype", "weight_dtype", "rank", "bias", "grad_required")


def _type_gate(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[str]:
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
    if x.shape[-1] != weight.shape[1]:
        return "rank"
    return None


def rows_gate(projection: str, m: int, n: int, k: int, small_batch: bool, which: str = "bucketed") -> Optional[str]:
    """None if a call of m rows through a [n, k] weight that passes the type checks may
    take the packed path, else the fallback reason."""
    if which == "invariant":
        return None
    return _seed_shapes(projection, m, n, k, small_batch) if which == "bucketed" else _measured_shapes(m, n, k)


def _seed_shapes(projection: str, m: int, n: int, k: int, small_batch: bool) -> Optional[str]:
    if n < MIN_FEATURES or k < MIN_FEATURES:
        return "small_features"
    if m * n * k < MIN_MACS:
        return "small_macs"
    if m == 1:
        return None
    if 2 <= m <= 15:
        return None if small_batch else "small_batch_off"
    if 16 <= m <= 128:
        return "lm_head_prefill_rows" if projection == "lm_head" else None
    return "rows_out_of_range"


def _measured_shapes(m: int, n: int, k: int) -> Optional[str]:
    return None if measured_packed_wins(m, n, k) else "measured_slower"


@functools.lru_cache(maxsize=1)
def _points() -> tuple[tuple[float, float, float, bool], ...]:
    """(log M, log N, log K, packed cheaper) of every measured grid point."""
    with open(_TABLE, encoding="utf-8") as f:
        table = json.load(f)
    return tuple((math.log(p["m"]), math.log(p["n"]), math.log(p["k"]),
                  p["packed_instructions"] < p["f_linear_instructions"]) for p in table["points"])


@functools.lru_cache(maxsize=4096)
def measured_packed_wins(m: int, n: int, k: int) -> bool:
    """Whether the packed kernel beat F.linear at the grid point nearest (M, N, K) (in log
    space, so 576 is nearer 1024 than 64); on a host without a table file, at this weight
    shape timed here (host_gate.py)."""
    if min(m, n, k) < 1:
        return False
    if _TABLE is None:
        from rvascend.dispatch import host_gate

        return host_gate.packed_wins(m, n, k)
    lm, ln, lk = math.log(m), math.log(n), math.log(k)
    return min(_points(), key=lambda p: (p[0] - lm) ** 2 + (p[1] - ln) ** 2 + (p[2] - lk) ** 2)[3]


def packable(n: int, k: int, which: str) -> bool:
    """Whether packing a [n, k] weight can pay: some call the gate routes can use it."""
    if which == "bucketed":
        return n >= MIN_FEATURES and k >= MIN_FEATURES
    if which == "invariant":
        return True
    return any(measured_packed_wins(m, n, k) for m in (1, 4, 16, 64))


def bucket_rows(m: int, small_batch: bool, which: str = "bucketed") -> int:
    """The row count a call of m rows is padded to (bucketed: m = 3 runs the 4-row callable; else m)."""
    if which != "bucketed" or m == 1:
        return m
    buckets = SMALL_BATCH_BUCKETS + PREFILL_BUCKETS[1:] if small_batch else PREFILL_BUCKETS
    for b in buckets:
        if m <= b:
            return b
    raise ValueError(f"{m} rows exceed the largest bucket ({buckets[-1]})")


def bucket_set(small_batch: bool) -> tuple[int, ...]:
    return (1,) + (SMALL_BATCH_BUCKETS + PREFILL_BUCKETS[1:] if small_batch else PREFILL_BUCKETS)

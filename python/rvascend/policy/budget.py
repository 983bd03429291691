"""The packed-weight memory budget and the deterministic partial-packing plan."""

from __future__ import annotations

from typing import Optional, Sequence

import psutil

from rvascend.ops import packed_weight_bytes

MIB = 1 << 20
GIB = 1 << 30


def derive_budget_bytes(memory_budget_mib: Optional[int]) -> int:
    """The explicit budget, else the host's available memory minus a reserve.

    The reserve keeps max(1 GiB, 10 % of RAM) free for activations, the KV
    pool and everything else the process and the host need.
    """
    if memory_budget_mib is not None:
        if memory_budget_mib < 0:
            raise ValueError(f"memory budget must be >= 0 MiB, got {memory_budget_mib}")
        return memory_budget_mib * MIB
    vm = psutil.virtual_memory()
    return max(0, vm.available - max(GIB, vm.total // 10))


def plan(sizes: Sequence[tuple[int, int]], budget_bytes: int) -> list[bool]:
    """Which modules fit, taken in order (first fit; a module that does not
    fit is skipped and later, smaller ones may still fit).

    `sizes` are (out_features, in_features) in the adapter's order: decoder
    layers front to back, lm_head last.
    """
    used, fits = 0, []
    for n, k in sizes:
        need = packed_weight_bytes(n, k)
        ok = used + need <= budget_bytes
        fits.append(ok)
        if ok:
            used += need
    return fits

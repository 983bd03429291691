"""Side-by-side timing helpers."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch


def time_calls(fns: Sequence[Callable[[], object]], min_seconds: float = 0.3,
               min_rounds: int = 5) -> list[float]:
    """Median seconds per call of each fn, measured in interleaved rounds.

    Interleaving (a, b, a, b, ...) exposes every candidate to the same
    machine state (frequency, other load) instead of timing them in sequence.
    """
    for fn in fns:  # warm-up: first-touch, caches, lazy initialisation
        fn()
    samples: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or time.perf_counter() - start < min_seconds * len(fns):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            samples[i].append(time.perf_counter() - t0)
        rounds += 1
    return [statistics.median(s) for s in samples]


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second moved by a large tensor copy (STREAM convention: a copy
    of S bytes moves 2*S, read + write)."""
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    (seconds,) = time_calls([lambda: dst.copy_(src)], min_seconds=1.0)
    return 2 * nbytes / seconds

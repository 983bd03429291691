"""glibc's malloc tuned for the two phases of a serving process.

glibc serves an allocation above its mmap threshold with its own mapping, returned
to the system on free, and below it from the heap, which keeps freed memory up to
its trim threshold.

Loading (`pin_mmap_threshold`): the threshold starts at 128 KiB but rises to the
size of any mapped block freed (up to 32 MiB), so once the loader frees its first
tensor in flight, weights of a few MiB come from the heap: when the policy's
packed copies replace them (--cpu-kernels-drop-unpacked) or a GGUF tensor is
converted, the old bytes stay resident and the new ones are added (SmolLM2-135M
BF16: 722 MiB peak against 681 with the threshold pinned). Pinned at 256 KiB,
every weight matrix is mapped and its pages leave with it.

Serving (`keep_step_buffers`, once the weights are in place): a step's
activations are the same sizes step after step, and above 256 KiB each was a
fresh mapping, faulted in and cleared a page at a time and unmapped at its free.
A 256-token prefill of Qwen3-0.6B-shaped Q4_K_M spent 1.30-1.37 s with that and
0.83-0.97 s with allocations up to 32 MiB from the heap and up to 32 MiB of freed
heap kept (2 threads, Zen 4, alternated runs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from typing import Optional

from absl import logging

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 256 << 10
TRIM_THRESHOLD_BYTES = 128 << 10  # glibc's default
STEP_BUFFER_BYTES = 32 << 20


def _glibc() -> Optional[ctypes.CDLL]:
    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _mallopt(settings: dict[int, int]) -> bool:
    libc = _glibc()
    if libc is None:
        return False
    ok = True
    for param, value in settings.items():
        if not libc.mallopt(param, value):
            logging.warning("mallopt(%d, %d) failed", param, value)
            ok = False
    return ok


def release_free_heap() -> bool:
    """Returns the heap's free pages to the system, whatever the thresholds (a caller
    that never pinned them keeps what a burst of temporaries freed: installing the
    policy on SmolLM2-135M left 77 MiB so); False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Before loading weights: every allocation above `threshold` is its own mapping,
    and freed heap memory is returned, what the heap kept until now included
    (process-wide); False where the C library is not glibc."""
    pinned = _mallopt({_M_MMAP_THRESHOLD: threshold, _M_TRIM_THRESHOLD: TRIM_THRESHOLD_BYTES})
    release_free_heap()
    return pinned


def keep_step_buffers(size: int = STEP_BUFFER_BYTES) -> bool:
    """Once the weights are in place: allocations up to `size` come from the heap and up
    to `size` of freed heap is kept, so each step reuses the last one's pages
    (process-wide); False where the C library is not glibc."""
    return _mallopt({_M_MMAP_THRESHOLD: size, _M_TRIM_THRESHOLD: size})

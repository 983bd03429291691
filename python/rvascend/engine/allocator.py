"""Makes freed weights leave the process instead of the C heap.

glibc serves an allocation above its mmap threshold with its own mapping, returned
to the system on free, and below it from the heap, which keeps freed memory. The
threshold starts at 128 KiB but rises to the size of any mapped block freed (up to
32 MiB), so once the loader frees its first tensor in flight, weights of a few MiB
come from the heap: when the policy's packed copies replace them
(--cpu-rvv-drop-unpacked) or a GGUF tensor is converted, the old bytes stay resident
and the new ones are added (SmolLM2-135M BF16: 722 MiB peak against 681 with the
threshold pinned). Pinning it at 256 KiB keeps every weight matrix mapped while
a decode step's activations stay on the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from absl import logging

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 256 << 10


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pins glibc's mmap threshold (process-wide); False where the C library is not glibc."""
    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    if not ok:
        logging.warning("mallopt(M_MMAP_THRESHOLD, %d) failed: freed weights may stay resident", threshold)
    return ok

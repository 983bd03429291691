"""The allocator's two phases (runtime/allocator.py) in a server's process, observed
through its page faults: while loading, a freed buffer above 256 KiB leaves the process
(the next one faults its pages in afresh); while serving, a step's buffers of a few MiB
are reused. It lives with the server because it measures on a server's heap."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_FAULTS = """
import resource
import torch
# A server's imports first: serving is measured on a heap like a server's (in a bare torch
# process, whose heap is nearly empty, the buffers' pages were faulted in afresh each time).
import rvascend.server.app
from rvascend.runtime import allocator

def faults(n=20, mib=4):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        torch.empty(mib << 20, dtype=torch.uint8).fill_(1)  # 256 pages a MiB, written
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

assert allocator.pin_mmap_threshold()
faults(1)
loading = faults()
assert allocator.keep_step_buffers()
faults(4)  # the heap settles on one or two places for the buffer
serving = faults()
assert allocator.pin_mmap_threshold()
# Larger than the freed chunks serving left inside the heap: glibc hands out a free chunk
# that fits before it maps anything, whatever the threshold.
faults(1, mib=16)
print(loading, serving, faults(mib=16))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_step_buffers_are_reused_and_loading_returns_freed_memory():
    # Its own process: the settings are process-wide.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True, env=env)
    loading, serving, loading_again = map(int, out.stdout.split())
    assert loading >= 20 * 1024 * 0.9, out.stdout      # a fresh mapping per buffer
    assert serving <= 20 * 1024 * 0.05, out.stdout     # the same heap pages again
    assert loading_again >= 20 * 4096 * 0.9, out.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Peak resident set size of a process (Linux VmHWM), in MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional


def peak_rss_mib(pid: Optional[int] = None) -> float:
    path = f"/proc/{pid or os.getpid()}/status"
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in {path}")


def reset_peak_rss() -> None:
    """Starts this process's peak (VmHWM) over from its current RSS (Linux >= 4.0:
    "5" to /proc/self/clear_refs), so a bench's own large buffers (a bandwidth
    probe) are not reported as the engine's peak."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def current_rss_mib(pid: Optional[int] = None) -> float:
    with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def fresh_process_json(code: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Runs `code` in a new Python process (its own VmHWM: memory tests measure a load
    there) and returns the JSON object it printed last."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                          timeout=timeout)
    return json.loads(done.stdout.strip().splitlines()[-1])

"""Deterministic instruction counts of chosen functions of a riscv64 binary under QEMU.

The binary runs once under `qemu-riscv64 -one-insn-per-tb -d exec,nochain
-dfilter <ranges>`, so QEMU logs one line per executed guest instruction whose PC
lies inside the functions (their address ranges come from the binary's symbol
table, matched by a regular expression on the demangled names).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Optional


def function_ranges(binary: str, nm: str, include: str, exclude: Optional[str] = None) -> list[tuple[int, int]]:
    """[start, end) of every defined function whose demangled name matches `include` and not `exclude`."""
    out = subprocess.run([nm, "-C", "-S", "--defined-only", binary], capture_output=True, text=True,
                         check=True).stdout
    want, skip = re.compile(include), re.compile(exclude) if exclude else None
    ranges = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[2] in "tTwW" and want.search(parts[3]) and not (skip and skip.search(parts[3])):
            start, size = int(parts[0], 16), int(parts[1], 16)
            if size:
                ranges.append((start, start + size))
    if not ranges:
        raise RuntimeError(f"no function of {binary} matches {include!r}")
    return sorted(ranges)


def count(binary: str, qemu: str, cpu: str, args: list[str], ranges: list[tuple[int, int]]) -> int:
    """Instructions executed inside `ranges` by one run of `binary ARGS` at `-cpu CPU`."""
    dfilter = ",".join(f"0x{a:x}..0x{b - 1:x}" for a, b in ranges)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        subprocess.run([qemu, "-one-insn-per-tb", "-d", "exec,nochain", "-dfilter", dfilter, "-D", log,
                        "-cpu", cpu, binary, *args], check=True, stdout=subprocess.DEVNULL)
        n = 0
        with open(log, "rb") as f:
            for line in f:
                if line.startswith(b"Trace "):
                    n += 1
        return n

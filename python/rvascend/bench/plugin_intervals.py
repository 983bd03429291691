"""The counting plugin's output (qemu_count_plugin.cc), read: "I <n>" starts
interval n (from marker n - 1 to marker n; interval 0 is the start-up, the last
one runs to exit), then "<page hex> <instructions> <vector instructions>" lines."""

from __future__ import annotations


def read_intervals(path: str) -> dict[int, dict[int, tuple[int, int]]]:
    """{interval: {code page: (instructions, vector instructions)}}."""
    intervals: dict[int, dict[int, tuple[int, int]]] = {}
    current: dict[int, tuple[int, int]] = {}
    with open(path) as f:
        for line in f:
            if line.startswith("I "):
                current = intervals.setdefault(int(line[2:]), {})
            else:
                page, n, v = line.split()
                current[int(page, 16)] = (int(n), int(v))
    return intervals

"""The counting plugin's output (qemu_count_plugin.cc), read: "I <n>" starts
interval n (from marker n - 1 to marker n; interval 0 is the start-up, the last
one runs to exit), then "<page hex> <instructions> <vector instructions>" lines,
"T <thread> <instructions> <vector instructions>" lines (per guest thread) and
"K <kind> <vector instructions>" lines (the interval's vector instructions by
kind, over all threads)."""

from __future__ import annotations

import dataclasses

Counts = dict[int, dict[int, tuple[int, int]]]


@dataclasses.dataclass(frozen=True)
class Intervals:
    pages: Counts                      # {interval: {code page: (instructions, vector instructions)}}
    threads: Counts                    # {interval: {guest thread: (instructions, vector instructions)}}
    kinds: dict[int, dict[str, int]]   # {interval: {vector kind: vector instructions}}

    def totals(self) -> list[tuple[int, int]]:
        """(instructions, vector instructions) of every interval, in order, over all threads."""
        return [(sum(n for n, _ in self.pages[i].values()), sum(v for _, v in self.pages[i].values()))
                for i in sorted(self.pages)]


def read(path: str) -> Intervals:
    pages: Counts = {}
    threads: Counts = {}
    kinds: dict[int, dict[str, int]] = {}
    current = current_threads = current_kinds = None
    with open(path) as f:
        for line in f:
            if line.startswith("I "):
                interval = int(line[2:])
                current, current_threads = pages.setdefault(interval, {}), threads.setdefault(interval, {})
                current_kinds = kinds.setdefault(interval, {})
            elif line.startswith("T "):
                _, thread, n, v = line.split()
                current_threads[int(thread)] = (int(n), int(v))
            elif line.startswith("K "):
                _, kind, v = line.split()
                current_kinds[kind] = int(v)
            else:
                page, n, v = line.split()
                current[int(page, 16)] = (int(n), int(v))
    return Intervals(pages, threads, kinds)


def read_intervals(path: str) -> Counts:
    """{interval: {code page: (instructions, vector instructions)}}."""
    return read(path).pages

"""The counting plugin's output (qemu_count_plugin.cc), read: "I <n>" starts
interval n (from marker n - 1 to marker n; interval 0 is the start-up, the last
one runs to exit), then "<page hex> <instructions> <vector instructions>" lines
and "T <thread> <instructions> <vector instructions>" lines (per guest thread)."""

from __future__ import annotations


def _read(path: str) -> tuple[dict[int, dict[int, tuple[int, int]]], dict[int, dict[int, tuple[int, int]]]]:
    pages: dict[int, dict[int, tuple[int, int]]] = {}
    threads: dict[int, dict[int, tuple[int, int]]] = {}
    current = current_threads = None
    with open(path) as f:
        for line in f:
            if line.startswith("I "):
                interval = int(line[2:])
                current, current_threads = pages.setdefault(interval, {}), threads.setdefault(interval, {})
            elif line.startswith("T "):
                _, thread, n, v = line.split()
                current_threads[int(thread)] = (int(n), int(v))
            else:
                page, n, v = line.split()
                current[int(page, 16)] = (int(n), int(v))
    return pages, threads


def read_intervals(path: str) -> dict[int, dict[int, tuple[int, int]]]:
    """{interval: {code page: (instructions, vector instructions)}}."""
    return _read(path)[0]


def read_thread_intervals(path: str) -> dict[int, dict[int, tuple[int, int]]]:
    """{interval: {guest thread: (instructions, vector instructions)}}."""
    return _read(path)[1]


def interval_totals(path: str) -> list[tuple[int, int]]:
    """(instructions, vector instructions) of every interval, in order, over all threads."""
    pages = _read(path)[0]
    return [(sum(n for n, _ in pages[i].values()), sum(v for _, v in pages[i].values())) for i in sorted(pages)]

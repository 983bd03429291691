"""Benchmark output: a printed table and jsonl records (with the run's manifest)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank p-th percentile (0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec); a missing or None value is an empty cell."""
    widths = [max(len(h), 10) for _, h, _ in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    for row in rows:
        cells = []
        for (key, _, spec), w in zip(columns, widths):
            value = row.get(key)
            cells.append((format(value, spec) if value not in ("", None) else "").rjust(w))
        print("  ".join(cells))


def write_jsonl(path: str, records: Iterable[dict[str, Any]], manifest: dict[str, Any] | None = None) -> None:
    """Appends records to a jsonl file; each carries the manifest when there is one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            if manifest is not None:
                record = {**record, "manifest": manifest}
            f.write(json.dumps(record, sort_keys=True) + "\n")

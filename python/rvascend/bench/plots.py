"""PNG plots of benchmark records (matplotlib, headless)."""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: str) -> None:
    """Writes the PNG, making its folder (a fresh checkout has no bench_results/)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_plot(path: str, title: str, labels: Sequence[str], series: dict[str, Sequence[float]], ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))], labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    _save(fig, path)


def stacked_region_plot(records: Sequence[dict], path: str, top: int = 9) -> None:
    """One bar per record of riscv64_step: each region's share of the decode step
    (stacked to 100 %), the step's total instructions written above the bar."""
    totals: dict[str, float] = {}
    for r in records:
        for name, n in r["regions"].items():
            totals[name] = totals.get(name, 0.0) + n / max(1.0, sum(r["regions"].values()))
    names = sorted(totals, key=lambda k: -totals[k])[:top]
    labels = [f"VLEN {r['vlen']}\n{r['mode']}\n" + (f"prefill {r['context']}" if r.get("kind") == "prefill"
                                                    else f"ctx {r['context']} M {r['rows']}") for r in records]
    fig, ax = plt.subplots(figsize=(max(8, len(records) * 0.9 + 2), 5.5))
    bottom = [0.0] * len(records)
    for name in names + ["other regions"]:
        values = []
        for r in records:
            whole = max(1.0, sum(max(0.0, v) for v in r["regions"].values()))
            part = r["regions"].get(name, 0.0) if name != "other regions" else \
                sum(v for k, v in r["regions"].items() if k not in names)
            values.append(100.0 * max(0.0, part) / whole)
        ax.bar(range(len(records)), values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, r in enumerate(records):
        ax.text(i, 101, f"{r['instructions'] / 1e9:.2f} G", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(records)), labels, fontsize=6)
    ax.set_ylim(0, 112)
    ax.set_ylabel("share of the step's instructions (%)")
    first = records[0] if records else {}
    ax.set_title(f"{first.get('shape', 'qwen3-0.6b')} steps on riscv64, {first.get('layers', '?')} layers "
                 "(total above each bar)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)

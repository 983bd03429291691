"""PNG plots of benchmark records (matplotlib, headless)."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bar_plot(path: str, title: str, labels: Sequence[str], series: dict[str, Sequence[float]], ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))], labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stacked_region_plot(records: Sequence[dict], path: str, top: int = 9) -> None:
    """One stacked bar (instructions by region) per record of riscv64_step."""
    totals: dict[str, float] = {}
    for r in records:
        for name, n in r["regions"].items():
            totals[name] = totals.get(name, 0.0) + n
    names = sorted(totals, key=lambda k: -totals[k])[:top]
    labels = [f"{r['mode']}\nctx {r['context']} M {r['rows']}" for r in records]
    fig, ax = plt.subplots(figsize=(max(7, len(records) * 0.8), 5))
    bottom = [0.0] * len(records)
    for name in names + ["other regions"]:
        values = [(r["regions"].get(name, 0.0) if name != "other regions" else
                   sum(v for k, v in r["regions"].items() if k not in names)) / 1e9 for r in records]
        ax.bar(range(len(records)), values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(records)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("G instructions per decode step (log)")
    ax.set_title("Qwen3-0.6B decode step on riscv64 (QEMU, extrapolated to 28 layers)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The plots write where they are told, making the folder: a fresh checkout has no bench_results/."""

from __future__ import annotations

from rvascend.bench import plots


def test_bar_plot_makes_its_folder(tmp_path):
    path = tmp_path / "bench_results" / "nested" / "one_batch.png"
    plots.bar_plot(str(path), "decode", ["off", "on"], {"tok/s": [1.0, 2.0]}, "tok/s")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_region_plot_makes_its_folder(tmp_path):
    path = tmp_path / "fresh" / "step.png"
    record = {"vlen": 256, "mode": "full", "context": 512, "rows": 1, "instructions": 1e9,
              "regions": {"linear": 8e8, "attention": 2e8}}
    plots.stacked_region_plot([record], str(path))
    assert path.stat().st_size > 0

"""The riscv64 step profile's extrapolation from two depths to the model's."""

from __future__ import annotations

import sys

import pytest

from rvascend.bench.riscv64_step import extrapolate
from rvascend.bench.step_summaries import turn_summary


def _run(layers: int, sampling: int) -> dict:
    """A step of `layers` layers: 100 instructions per layer in attention, a fixed
    sampling region, 10 unmarked instructions per layer plus 5 once."""
    regions = {"attention": (100 * layers, 40 * layers), "sampling": (sampling, 0)}
    libs = {"attention": {"kernels": 100 * layers}, "sampling": {"python": sampling}}
    total = 100 * layers + sampling + 10 * layers + 5
    return {"total": total, "vector": 40 * layers, "regions": regions, "region_libraries": libs,
            "libraries": {"kernels": 100 * layers, "python": sampling + 10 * layers + 5},
            "marker_overhead": 0}


def test_per_layer_regions_scale_and_fixed_ones_take_the_runs_mean():
    # The fixed region differs by 30 between the runs: a linear fit to 28 layers would move
    # it by 27 * 30 (and by as much the total); the mean moves it by 15.
    step = extrapolate(_run(1, 1000), _run(2, 970), 28)
    assert step["regions"]["attention"] == (2800, 1120)
    assert step["regions"]["sampling"] == (985, 0)
    assert step["total"] == 2800 + 985 + 280 + 5
    assert step["vector"] == 1120
    assert step["libraries"] == {"kernels": 2800, "python": 985 + 285}
    assert step["region_libraries"]["sampling"] == {"python": 985}


def _step(kind: str, context: int, tokens: int, seconds: float) -> dict:
    """A counted step's record whose calibrated K1 time is `seconds` at 4 threads, half at 8."""
    return {"vlen": 256, "mode": "full", "kind": kind, "context": context, "rows": 1,
            "k1_calibrated_tok_s_4_threads": tokens / seconds, "k1_calibrated_tok_s_8_threads": 2 * tokens / seconds}


def test_a_turn_is_set_against_its_whole_prompt_in_interpolated_chunks():
    # Chunks of 64: 1.0 s at context 0, 1.6 s at 192 (the last of 4 before 256 cached tokens);
    # between, linear: 1.2 and 1.4 s. The turn of 20 new tokens: 0.5 s.
    records = [_step("prefill", 64, 64, 1.0), _step("turn64", 192, 64, 1.6), _step("turn20", 256, 20, 0.5)]
    (row,) = turn_summary(records)
    assert (row["cached"], row["new"], row["chunk"]) == (256, 20, 64)
    assert row["whole_prompt_s_4t"] == pytest.approx(1.0 + 1.2 + 1.4 + 1.6 + 0.5)
    assert row["speedup_4t"] == pytest.approx(5.7 / 0.5) and row["speedup_8t"] == pytest.approx(5.7 / 0.5)
    assert turn_summary(records[:2]) == []  # no turn counted: nothing to set against


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The riscv64 step profile's extrapolation from two depths to the model's."""

from __future__ import annotations

import sys

import pytest

from rvascend.bench.riscv64_step import extrapolate


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

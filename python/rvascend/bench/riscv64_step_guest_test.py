"""The whole-step profiler's guest, run on the host: it drives the engine's internals
(running sequences set up without a prefill, steps rewound), so an engine change that
breaks it must fail here, not only in an hour-long QEMU benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import rvascend
from rvascend.bench.riscv64_step import LINEARS
from rvascend.engine.random_model import ensure_random_model

_GUEST = os.path.join(os.path.dirname(__file__), "riscv64_step_guest.py")


@pytest.mark.parametrize("mode", ["off", "op_by_op", "full"])
def test_the_guest_marks_every_region_of_decode_and_prefill_steps(mode):
    configs = [[16, 1, "decode"], [24, 2, "decode"], [12, 1, "prefill"]]
    args = json.dumps({"checkpoint": ensure_random_model(), "mode": mode, "configs": configs})
    package = os.path.dirname(os.path.dirname(rvascend.__file__))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, _GUEST, args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("STEP ")]
    assert [[s["context"], s["rows"], s["kind"]] for s in steps] == configs
    for step in steps:
        regions = set(step["regions"])
        assert set(LINEARS) <= regions and {"attention", "rms_norm", "embedding", "sampling"} <= regions
        # Markers: the total's two (its interval is the one between them), then the breakdown's.
        assert step["marked_first_interval"] == step["total_interval"] + 2
        assert step["marked_last_interval"] - step["marked_first_interval"] + 1 == len(step["regions"])
    assert any(line.startswith("MAPS ") for line in proc.stdout.splitlines())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The shape gates: the seed's contract, the measured riscv64 gate and its table."""

from __future__ import annotations

import json
import platform

import pytest
import torch

from rvascend.bench import image_instruction_count
from rvascend.policy import shape_gate


@pytest.fixture
def synthetic_table(tmp_path, monkeypatch):
    """A table where the packed kernel wins only at n = k = 1024 (every M)."""
    points = []
    for m in (1, 16):
        for n in (64, 1024):
            for k in (64, 1024):
                wins = n == 1024 and k == 1024
                points.append({"m": m, "n": n, "k": k, "f_linear_instructions": 1000,
                               "packed_instructions": 10 if wins else 5000})
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"vlen": 256, "points": points}))
    monkeypatch.setattr(shape_gate, "_TABLE", str(path))
    shape_gate._points.cache_clear()
    shape_gate.measured_packed_wins.cache_clear()
    yield
    shape_gate._points.cache_clear()
    shape_gate.measured_packed_wins.cache_clear()


def _call(m: int, n: int, k: int, dtype=torch.bfloat16):
    return torch.zeros(m, k, dtype=dtype), torch.zeros(n, k, dtype=torch.bfloat16)


def test_nearest_point_is_taken_in_log_space(synthetic_table):
    # 576 is nearer 1024 than 64 in log space (and farther in linear space).
    assert shape_gate.measured_packed_wins(1, 576, 576)
    assert not shape_gate.measured_packed_wins(1, 200, 200)
    assert shape_gate.measured_packed_wins(7, 1024, 900)
    assert not shape_gate.measured_packed_wins(1, 1024, 100)
    assert not shape_gate.measured_packed_wins(0, 1024, 1024)


def test_measured_gate_routes_where_the_table_says(synthetic_table):
    x, w = _call(3, 1024, 1024)
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="measured") is None
    # The seed gate refuses the same call (3 rows without small batches).
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="seed") == "small_batch_off"
    x, w = _call(1, 64, 1024)
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="measured") == "measured_slower"
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="seed") == "small_features"
    # Type checks come first in both gates.
    x, w = _call(1, 1024, 1024, dtype=torch.float32)
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="measured") == "input_dtype"
    x, w = _call(1, 1024, 1024)
    assert shape_gate.gate("o_proj", x, w, torch.zeros(1024, dtype=torch.bfloat16), False,
                           which="measured") == "bias"


def test_measured_gate_never_pads_rows(synthetic_table):
    assert [shape_gate.bucket_rows(m, False, "measured") for m in (1, 3, 17, 300)] == [1, 3, 17, 300]
    assert [shape_gate.bucket_rows(m, True, "seed") for m in (1, 3, 17)] == [1, 4, 32]
    with pytest.raises(ValueError, match="largest bucket"):
        shape_gate.bucket_rows(300, True, "seed")


def test_packable_follows_the_gate(synthetic_table):
    assert shape_gate.packable(1024, 1024, "measured")
    assert not shape_gate.packable(64, 1024, "measured")
    assert shape_gate.packable(1024, 1024, "seed")
    assert not shape_gate.packable(576, 576, "seed")


def test_default_gate_per_machine(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert shape_gate.resolve(None) == "measured"
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert shape_gate.resolve(None) == "seed"
    assert shape_gate.resolve("measured") == "measured"
    with pytest.raises(ValueError, match="--cpu-rvv-shape-gate must be one of seed, measured"):
        shape_gate.resolve("fast")


def test_committed_table_covers_the_grid():
    with open(shape_gate._TABLE, encoding="utf-8") as f:
        table = json.load(f)
    assert table["vlen"] == 256
    got = {(p["m"], p["n"], p["k"]) for p in table["points"]}
    want = {(m, n, k) for m in image_instruction_count.GRID_M for n in image_instruction_count.GRID_N
            for k in image_instruction_count.GRID_K}
    assert got == want
    for p in table["points"]:
        assert p["f_linear_instructions"] > 0 and p["packed_instructions"] > 0, p


def test_committed_table_packs_the_default_model():
    """SmolLM2-135M (hidden 576, K/V 192, MLP 1536) is the served default: the measured
    gate must pack its projections, which the seed's N, K >= 1024 gate never does."""
    shape_gate._points.cache_clear()
    shape_gate.measured_packed_wins.cache_clear()
    for n, k in ((576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536)):
        assert shape_gate.packable(n, k, "measured"), (n, k)
        assert not shape_gate.packable(n, k, "seed"), (n, k)
        assert shape_gate.measured_packed_wins(1, n, k), (n, k)

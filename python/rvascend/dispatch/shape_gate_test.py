"""The shape gates: the seed's contract, the measured gate and its tables (riscv64's committed
instruction counts, other hosts' timed and cached ones)."""

from __future__ import annotations

import json
import os
import platform

import pytest
import torch

from rvascend.dispatch import host_gate, shape_gate


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
    # The bucketed gate refuses the same call (3 rows without small batches).
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="bucketed") == "small_batch_off"
    x, w = _call(1, 64, 1024)
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="measured") == "measured_slower"
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="bucketed") == "small_features"
    # Type checks come first in both gates.
    x, w = _call(1, 1024, 1024, dtype=torch.float32)
    assert shape_gate.gate("o_proj", x, w, None, small_batch=False, which="measured") == "input_dtype"
    x, w = _call(1, 1024, 1024)
    assert shape_gate.gate("o_proj", x, w, torch.zeros(1024, dtype=torch.bfloat16), False,
                           which="measured") == "bias"


def test_measured_gate_never_pads_rows(synthetic_table):
    assert [shape_gate.bucket_rows(m, False, "measured") for m in (1, 3, 17, 300)] == [1, 3, 17, 300]
    assert [shape_gate.bucket_rows(m, True, "bucketed") for m in (1, 3, 17)] == [1, 4, 32]
    with pytest.raises(ValueError, match="largest bucket"):
        shape_gate.bucket_rows(300, True, "bucketed")


def test_packable_follows_the_gate(synthetic_table):
    assert shape_gate.packable(1024, 1024, "measured")
    assert not shape_gate.packable(64, 1024, "measured")
    assert shape_gate.packable(1024, 1024, "bucketed")
    assert not shape_gate.packable(576, 576, "bucketed")


def test_default_gate_per_machine(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert shape_gate.resolve(None) == "invariant"
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert shape_gate.resolve(None) == "measured"
    assert shape_gate.resolve("measured") == "measured"
    assert shape_gate.resolve("seed") == "bucketed"  # the gate's earlier name, still accepted
    with pytest.raises(ValueError, match="--cpu-kernels-shape-gate must be one of bucketed, measured"):
        shape_gate.resolve("fast")


def test_the_invariant_default_on_riscv64_costs_nothing():
    """riscv64's default gate is the invariant one because its measured grid has the packed
    kernel cheaper at every point: there both gates route every call alike. A grid where
    F.linear wins somewhere would make that default cost instructions."""
    with open(shape_gate.RISCV64_TABLE, encoding="utf-8") as f:
        points = json.load(f)["points"]
    assert points and all(p["packed_instructions"] < p["f_linear_instructions"] for p in points)
    for m, n, k in ((1, 576, 576), (7, 1536, 576), (300, 576, 1536), (1, 49152, 576)):
        assert shape_gate.rows_gate("o_proj", m, n, k, True, "invariant") is None


def test_committed_table_covers_the_grid():
    with open(shape_gate.RISCV64_TABLE, encoding="utf-8") as f:
        table = json.load(f)
    assert table["vlen"] == 256
    got = {(p["m"], p["n"], p["k"]) for p in table["points"]}
    want = {(m, n, k) for m in shape_gate.RISCV64_GRID_M for n in shape_gate.RISCV64_GRID_N
            for k in shape_gate.RISCV64_GRID_K}
    assert got == want
    for p in table["points"]:
        assert p["f_linear_instructions"] > 0 and p["packed_instructions"] > 0, p


def test_committed_table_packs_the_default_model(monkeypatch):
    """SmolLM2-135M (hidden 576, K/V 192, MLP 1536) is the served default: the measured
    gate must pack its projections on riscv64, which the seed's N, K >= 1024 gate never does."""
    monkeypatch.setattr(shape_gate, "_TABLE", shape_gate.RISCV64_TABLE)
    shape_gate._points.cache_clear()
    shape_gate.measured_packed_wins.cache_clear()
    for n, k in ((576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536)):
        assert shape_gate.packable(n, k, "measured"), (n, k)
        assert not shape_gate.packable(n, k, "bucketed"), (n, k)
        assert shape_gate.measured_packed_wins(1, n, k), (n, k)


def _timed_entry(wins_from_m: int) -> dict:
    """A timed shape where the packed kernel is faster from `wins_from_m` rows on."""
    return {"m": [1, 4, 16, 64], "f_linear_seconds": [1.0] * 4,
            "packed_seconds": [0.5 if m >= wins_from_m else 2.0 for m in (1, 4, 16, 64)]}


@pytest.fixture
def host_cache(tmp_path, monkeypatch):
    """The measured gate on a host without a table file, with its cache in tmp_path."""
    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(shape_gate, "_TABLE", None)
    for clear in (shape_gate._points.cache_clear, shape_gate.measured_packed_wins.cache_clear, host_gate.forget):
        clear()
    yield tmp_path
    for clear in (shape_gate._points.cache_clear, shape_gate.measured_packed_wins.cache_clear, host_gate.forget):
        clear()


def test_a_weight_shape_is_timed_once_then_read_from_the_cache(host_cache, monkeypatch):
    monkeypatch.setattr(host_gate, "MAX_TIMED_MACS", 16 * 96 * 64)
    entry = host_gate.shape_entry(96, 64)
    assert entry["m"] == [1, 4, 16]  # M = 64 is over the MACs cap: M = 16 decides for it
    assert all(t > 0 for t in entry["f_linear_seconds"] + entry["packed_seconds"])
    path = host_gate.table_path()
    assert path.startswith(str(host_cache)) and f"t{torch.get_num_threads()}" in os.path.basename(path)

    def never(*_):
        raise AssertionError("timed again although the shape is cached")
    monkeypatch.setattr(host_gate, "time_shape", never)
    host_gate.forget()  # a new process: from the file
    assert host_gate.shape_entry(96, 64) == entry
    # Another thread count is another host as far as the gate is concerned.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert host_gate.table_path() != path
    finally:
        torch.set_num_threads(threads)


def test_timed_shapes_decide_the_measured_gate(host_cache, monkeypatch):
    timed = []

    def fake(n, k):
        timed.append((n, k))
        return _timed_entry(wins_from_m=16 if n == 576 else 1)
    monkeypatch.setattr(host_gate, "time_shape", fake)
    x, w = _call(3, 576, 576)  # nearest timed M is 4: F.linear was faster
    assert shape_gate.gate("o_proj", x, w, None, small_batch=True, which="measured") == "measured_slower"
    x, w = _call(40, 576, 576)  # nearest is 64
    assert shape_gate.gate("o_proj", x, w, None, small_batch=True, which="measured") is None
    assert shape_gate.packable(576, 576, "measured") and shape_gate.packable(960, 576, "measured")
    assert shape_gate.measured_packed_wins(1, 960, 576)
    assert timed == [(576, 576), (960, 576)]  # each shape once
    with open(host_gate.table_path(), encoding="utf-8") as f:
        assert set(json.load(f)["shapes"]) == {"576x576", "960x576"}


def test_a_corrupt_cache_file_is_timed_again(host_cache, monkeypatch):
    path = host_gate.table_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        f.write("{not json")
    monkeypatch.setattr(host_gate, "time_shape", lambda n, k: _timed_entry(wins_from_m=1))
    assert shape_gate.measured_packed_wins(1, 256, 256)
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["shapes"] == {"256x256": _timed_entry(wins_from_m=1)}


@pytest.mark.parametrize("bad", [
    {"m": [1, 4], "f_linear_seconds": [1.0, 1.0]},                                   # no packed_seconds
    {"m": [1, 4], "f_linear_seconds": [1.0], "packed_seconds": [0.5, 0.5]},          # lengths differ
    {"m": ["1"], "f_linear_seconds": [1.0], "packed_seconds": [0.5]},                # not an int
    {"m": [1], "f_linear_seconds": [float("nan")], "packed_seconds": [0.5]},
    {"m": [], "f_linear_seconds": [], "packed_seconds": []},
    [1, 2, 3],
])
def test_a_malformed_entry_is_timed_again_not_a_key_error(host_cache, monkeypatch, bad):
    """A malformed entry once passed the load and raised KeyError inside a step."""
    path = host_gate.table_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"shapes": {"256x256": bad, "x512": _timed_entry(wins_from_m=1)}}, f)
    timed = []
    monkeypatch.setattr(host_gate, "time_shape", lambda n, k: timed.append((n, k)) or _timed_entry(wins_from_m=1))
    assert shape_gate.measured_packed_wins(1, 256, 256)
    assert timed == [(256, 256)]
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["shapes"] == {"256x256": _timed_entry(wins_from_m=1)}

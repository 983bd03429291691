"""The board model's calibration: the fit's pieces, and the calibrated constants
reproduced from the checked-in public points and llama.cpp counts."""

from __future__ import annotations

import hashlib
import math

import pytest

from rvascend.bench import k1_model
from rvascend.bench.calibration import fit


def test_nelder_mead_finds_the_minimum_of_a_bowl():
    x = fit.nelder_mead(lambda v: (v[0] - 1.5) ** 2 + 3 * (v[1] + 0.5) ** 2 + 1, [0.0, 0.0])
    assert x == pytest.approx([1.5, -0.5], abs=1e-4)


def _record(prefill_n, decode_n, vector=0.0, weight_bytes=1e9):
    return {"model": "tinyllama-1.1b", "prefill": {"64": [prefill_n, vector]},
            "decode": {"34": [decode_n, vector], "514": [9e99, 0]}, "decode_weight_bytes": weight_bytes}


def test_a_prompt_is_timed_whole_and_a_token_at_the_nearest_counted_context():
    board = k1_model.Board("t", 1e9, 1.0, 1.0, {8: 1e12}, {8: 1.0}, "test")
    record = _record(prefill_n=8e9, decode_n=8e8)
    # 8e9 instructions on 8 cores at 1 GHz: 1 s for 64 tokens.
    assert fit.project(board, {"test": "pp", "length": 64, "threads": 8}, record) == pytest.approx(64)
    # tg10 after a 32-token prompt: context ~37, nearest counted 34 (not 514).
    assert fit.project(board, {"test": "tg", "length": 10, "prompt": 32, "threads": 8}, record) == pytest.approx(10)
    slow_memory = k1_model.Board("t", 1e9, 1.0, 1.0, {8: 1e9}, {8: 1.0}, "test")
    # DRAM-bound: the weights and the K/V at context 34 (K and V, F16, 4 KV heads of 64, 22 layers).
    kv = 2 * 2 * 34 * 4 * 64 * 22
    assert fit.project(slow_memory, {"test": "tg", "length": 10, "prompt": 32, "threads": 8}, record) == \
        pytest.approx(1e9 / (1e9 + kv))


def _points_made_by(board, records):
    """A prompt and a generation point of every record, at the speeds `board` projects."""
    points = []
    for (model, kind, variant), record in records.items():
        for test, extra in (("pp", {"length": 64}), ("tg", {"length": 4, "prompt": 32})):
            p = {"id": f"{variant}{test}", "model": model, "type": kind, "variant": variant, "threads": 8,
                 "test": test, **extra, "held_out": False}
            p["tok_s"] = fit.project(board, p, record)
            points.append(p)
    return points


# Two counted programs of one file, and a board that made their points.
TRUTH = k1_model.Board("truth", 1.6e9, 0.7, 3.0, {8: 5e9}, {8: 1.0}, "test")
RECORDS = {("m", "t", "a"): {"model": "tinyllama-1.1b", "prefill": {"64": [6e9, 1e9]},
                             "decode": {"34": [1e8, 8e7]}, "decode_weight_bytes": 6e8},
           ("m", "t", "b"): {"model": "tinyllama-1.1b", "prefill": {"64": [3e9, 2e9]},
                             "decode": {"34": [9e7, 1e7]}, "decode_weight_bytes": 6e8}}


def test_the_fit_recovers_constants_that_made_the_points():
    records = RECORDS
    points = _points_made_by(TRUTH, records)
    result = fit.fit(points, records, prior_weight=0.0)
    assert result.fit_error < 1e-3
    assert result.board.ipc_scalar == pytest.approx(0.7, rel=1e-2)
    assert result.board.cpi_vector == pytest.approx(3.0, rel=1e-2)
    assert result.board.bandwidth[8] == pytest.approx(5e9, rel=1e-2)
    # The pull toward the assumed constants moves a well-determined fit only a little.
    pulled = fit.fit(points, records)
    assert pulled.fit_error < 0.05 and pulled.board.ipc_scalar == pytest.approx(0.7, rel=0.1)


def test_every_public_point_names_its_source_threads_and_version():
    points = fit.load_points()
    assert len(points) >= 15 and any(p["held_out"] for p in points)
    for p in points:
        assert p["source"].startswith("llama.cpp ") and p["llama_cpp"] and p["threads"] in (1, 4, 8)
        assert p["test"] in ("pp", "tg") and p["tok_s"] > 0
        assert p["variant"] in ("repack", "vec_dot") if p.get("backend") != "ime" else p["test"] == "tg"


def test_the_calibrated_board_is_what_the_checked_in_inputs_fit_to():
    with open(fit.COUNTS, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == k1_model.CALIBRATION_COUNTS_SHA256
    result = fit.fit(fit.load_points(), fit.load_counts())
    c = k1_model.CALIBRATED
    assert result.board.ipc_scalar == pytest.approx(c.ipc_scalar, rel=1e-3)
    assert result.board.cpi_vector == pytest.approx(c.cpi_vector, rel=1e-3)
    assert result.board.bandwidth[8] == pytest.approx(c.bandwidth[8], rel=1e-3)
    assert result.board.bandwidth[4] == pytest.approx(c.bandwidth[4], rel=1e-3)
    assert result.board.cpi_kinds == pytest.approx(c.cpi_kinds, rel=1e-3)
    assert (round(result.fit_error, 3), round(result.held_out_error, 3)) == k1_model.CALIBRATION_ERRORS
    assert all(math.isfinite(r["projected"]) for r in result.rows)


def test_the_fit_recovers_a_cost_per_kind_of_vector_instruction():
    # Two programs with the same instruction counts but another mix of reductions: one
    # CPI for every vector instruction cannot tell them apart, one per kind can.
    groups = {"reduction": ("reduction",), "rest": ("memory", "multiply")}
    truth = k1_model.Board("truth", 1.6e9, 0.8, 4.0, {8: 1e13}, {8: 1.0}, "test",
                           cpi_kinds={"reduction": 9.0, "memory": 2.0, "multiply": 2.0})

    def record(reductions: float) -> dict:
        kinds = {"reduction": reductions, "memory": 1e9 - reductions - 2e8, "multiply": 2e8}
        small = {k: v / 40 for k, v in kinds.items()}
        return {"model": "tinyllama-1.1b", "prefill": {"64": [3e9, 1e9]}, "decode": {"34": [2e8, 1e9 / 40]},
                "prefill_kinds": {"64": kinds}, "decode_kinds": {"34": small}, "decode_weight_bytes": 6e8}

    records = {("m", "t", "few"): record(1e8), ("m", "t", "many"): record(5e8)}
    points = _points_made_by(truth, records)
    assert points[2]["tok_s"] < 0.7 * points[0]["tok_s"]  # the reductions cost the second its speed
    result = fit.fit(points, records, prior_weight=0.0, groups=groups)
    assert result.fit_error < 1e-3
    assert result.board.cpi_kinds["reduction"] / result.board.cpi_kinds["memory"] == pytest.approx(4.5, rel=0.05)
    # One CPI for all cannot fit both.
    assert fit.fit(points, records, prior_weight=0.0, groups={}).fit_error > 0.1


def test_an_ime_generation_point_sets_the_bandwidth_at_its_thread_count_from_below():
    records = RECORDS
    points = _points_made_by(TRUTH, records)
    base = k1_model.Board("base", 1.6e9, 1.0, 4.0, {1: 2e9, 2: 7e9}, {1: 1.0}, "test")
    without = fit.fit(points, records, base=base, prior_weight=0.0)
    # No floor: the assumed all-core figure, from 2 threads up, held to what 8 threads fit.
    assert without.board.bandwidth_at(4) == pytest.approx(5e9, rel=1e-2)
    # Two IME runs on 4 threads of files with tinyllama-1.1b's K/V: 6 tok/s and 5 tok/s, each token
    # reading the file's 6e8 bytes and K/V at context 32.
    kv = 2 * 2 * 32 * 4 * 64 * 22
    ime = [{"id": f"ime{i}", "model": "m", "type": "t", "backend": "ime", "threads": 4, "test": "tg", "length": 64,
            "prompt": 0, "tok_s": tok_s, "held_out": False} for i, tok_s in enumerate((6.0, 5.0))]
    result = fit.fit(points + ime, records, base=base, prior_weight=0.0)
    assert result.board.bandwidth[4] == pytest.approx(6.0 * (6e8 + kv))
    assert result.board.bandwidth_at(2) == result.board.bandwidth[4]  # two threads stream no more than four
    assert result.board.bandwidth[8] == pytest.approx(5e9, rel=1e-2)  # what the counted points fit
    floors = {r["id"]: r["ratio"] for r in result.rows if r["role"] == "bandwidth floor"}
    assert floors == pytest.approx({"ime0": 1.0, "ime1": 5 / 6})
    # They time nothing, so the errors are the counted points' alone.
    assert (result.fit_error, result.held_out_error) == (without.fit_error, without.held_out_error)

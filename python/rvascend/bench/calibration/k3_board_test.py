"""The K3 board's inputs: rvv-bench's tables read, instructions put in the counting plugin's kinds."""

import json
import math

import pytest

from rvascend.bench import k1_model
from rvascend.bench.calibration import k3_board

HEAD = "<thead><tr><th>instruction</th><th>e8m1</th><th>e8m2</th><th>e32m4</th><th>e32m8</th></tr></thead>"


def _page(*tables: list[tuple[str, list[str]]]) -> str:
    out = []
    for rows in tables:
        body = "".join(f"<tr><td>{name}</td>" + "".join(f"<td>{v}</td>" for v in cells) + "</tr>"
                       for name, cells in rows)
        out.append(f'<table id="t" class="tabPage">{HEAD}{body}</table>')
    # rvv-bench pages also hold layout tables without an e8 column: not instruction timings.
    return "<table><tr><td>LMUL=1</td></tr></table>" + "".join(out)


def test_a_row_empty_in_one_table_is_taken_from_the_next():
    page = _page([("vle8.v v8,(t0)", ["", "", "", ""]), ("vadd.vv v8,v16,v24", ["1.00", "2.00", "", ""])],
                 [("vle8.v v8,(t0)", ["2.50", "4.45", "", ""]), ("vadd.vv v8,v16,v24", ["9", "9", "9", "9"])])
    rows = k3_board.parse_tables(page)
    assert rows == {"vle8.v v8,(t0)": {"e8m1": 2.5, "e8m2": 4.45},
                    "vadd.vv v8,v16,v24": {"e8m1": 1.0, "e8m2": 2.0}}


@pytest.mark.parametrize("instruction,kind", [
    ("vsetvli t0,x0,e8,m1,ta,ma", "config"), ("vle8.v v8,(t0)", "memory"), ("vse32.v v8,(t0)", "memory"),
    ("vlseg4e16ff.v v8,(t0)", "memory"), ("vlse32.v v8,(t0),t1", "memory"), ("vluxei16.v v8,(t0),v16", "memory"),
    ("vl2re8.v v8,(t0)", "memory"), ("vredsum.vs v8,v16,v24", "reduction"), ("vwredsum.vs v8,v16,v24", "reduction"),
    ("vfredusum.vs v8,v16,v24", "reduction"), ("vrgather.vv v8,v16,v24", "permute"),
    ("vslidedown.vx v8,v16,t0", "permute"), ("vfslide1up.vf v8,v16,ft0", "permute"),
    ("vwmacc.vx v8,t0,v16", "multiply"), ("vmulhsu.vv v8,v16,v24", "multiply"), ("vnmsub.vx v8,t0,v16", "multiply"),
    ("vdiv.vv v8,v16,v24", "integer"), ("vsmul.vv v8,v16,v24", "integer"), ("vsll.vx v8,v16,t0", "integer"),
    ("vsext.vf2 v8,v16", "integer"), ("vfirst.m t0,v16", "integer"), ("vfwmacc.vf v8,ft0,v16", "float"),
    ("vmfeq.vv v0,v16,v24", "float"), ("vfmv.f.s ft0,v16", "float"), ("add t0,t1,t2", None)])
def test_instructions_take_the_counting_plugins_kinds(instruction, kind):
    # qemu_count_plugin.cc sorts by encoding: vfirst is OPMVV (integer), vmfeq OPFVV (float),
    # vdiv is not among its multiplies.
    assert k3_board.vector_kind(instruction) == kind


def test_a_kinds_ratio_is_the_geometric_mean_over_its_unmasked_instructions_and_lmuls():
    x60 = {"vle8.v v8,(t0)": {"e8m1": 2.0, "e8m2": 4.0, "e32m8": 16.0},
           "vle8.v v8,(t0),v0.t": {"e8m1": 100.0},
           "vwmacc.vx v8,t0,v16": {"e8m1": 2.0},
           "add t0,t1,t2": {"e8m1": 0.6, "e8m2": 0.5}}
    x100 = {"vle8.v v8,(t0)": {"e8m1": 1.0, "e8m2": 4.0, "e32m8": 1.0},
            "vle8.v v8,(t0),v0.t": {"e8m1": 1.0},
            "vwmacc.vx v8,t0,v16": {"e8m2": 1.0},
            "add t0,t1,t2": {"e8m1": 0.3, "e8m2": 5.0}}
    r = k3_board.ratios(x60, x100)
    # e32m8 is not a column the kernels run; the masked row and the add's e8m2 are left out.
    assert r["memory"] == {"ratio": pytest.approx(math.sqrt(0.5)), "pairs": 2}
    assert r["scalar"] == {"ratio": pytest.approx(0.5), "pairs": 1}
    assert r["vector"]["pairs"] == 2 and "multiply" not in r  # no column both cores time


def test_the_k3_board_is_the_calibrated_k1_scaled_by_the_checked_in_ratios():
    with open(k3_board.RATIOS, encoding="utf-8") as f:
        stored = json.load(f)
    assert stored["commit"] != "unknown" and stored["lmuls"] == list(k3_board.LMULS)
    assert {k: round(v["ratio"], 4) for k, v in stored["kinds"].items()} == k1_model.X100_OVER_X60
    k3, k1 = k1_model.K3_ON_PAPER, k1_model.CALIBRATED
    assert k3.clock_hz == 2.4e9 and set(k3.bandwidth) == {8}
    # 2.21 GiB read per token at 11.29 tok/s.
    assert k3.bandwidth[8] == pytest.approx(26.79e9, rel=1e-3)
    assert k3.ipc_scalar == pytest.approx(k1.ipc_scalar / k1_model.X100_OVER_X60["scalar"])
    for kind, cycles in k1.cpi_kinds.items():
        assert k3.cpi_kinds[kind] == pytest.approx(cycles * k1_model.X100_OVER_X60.get(kind, 1.0)), kind
    assert k3.cpi_kinds["config"] == k1.cpi_kinds["config"]  # the tables time no vset{i}vl{i}

"""The K3's X100 cores on paper: the calibrated K1 board, scaled by what the X100 measures against the X60.

  python -m rvascend.bench.calibration.k3_board --rvv_bench_results=DIR [--output=FILE]

No plain-RVV llama.cpp figure on the K3's X100 cores is public, so no constant here is
fitted to one. What is public, and measured on both cores by one tool, are rvv-bench's
instruction tables (DIR: a checkout of github.com/camel-cdr/rvv-bench-results; its
spacemit_x60/ and spacemit_x100/ pages): the cycles per instruction in a long run of
independent instructions (reciprocal throughput) of every RVV instruction at every
SEW and LMUL, and of a scalar add beside them. From those, per kind of vector
instruction as qemu_count_plugin.cc counts them, the geometric mean over the kind's
instructions (unmasked, at the LMULs the counted kernels run: LMULS) of X100 cycles /
X60 cycles; and the same for the scalar add. The K3 board (k1_model.K3_ON_PAPER) is
k1_model.CALIBRATED with each kind's cycles times its ratio, scalar IPC divided by the
add's, the X100's clock (2.4 GHz, rvv-bench's X100 page), and DRAM at the floor
SpacemiT's IME2 generation figures set (k1_model.K3_BANDWIDTH). The tables have no
vset{i}vl{i}: that kind keeps the K1's cycles.

Written next to this file as x100_over_x60.json (the ratios and the commit they came
from); k1_model's K3 constants are checked against it (k3_board_test.py).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import sys
from typing import Optional

from absl import app, flags

from rvascend.bench.results import print_table

FLAGS = flags.FLAGS
HERE = os.path.dirname(os.path.abspath(__file__))
RATIOS = os.path.join(HERE, "x100_over_x60.json")
# The SEW/LMUL columns taken: the e8 m1 / m2, e16 m1 / m2 and e32 m1 / m2 / m4 groups the
# quantized, BF16 and elementwise kernels of both engines run at VLEN 256.
LMULS = ("e8m1", "e8m2", "e16m1", "e16m2", "e32m1", "e32m2", "e32m4")
# The scalar add's columns: the vector configuration the harness set around it, m1 only
# (at larger LMUL the harness's vector work, not the add, sets the time).
SCALAR_LMULS = ("e8m1", "e16m1", "e32m1", "e64m1")
CORES = ("spacemit_x60", "spacemit_x100")

_ROW = re.compile(r"<tr><td>([^<]*)</td>((?:<td>[^<]*</td>)*)</tr>")
_CELL = re.compile(r"<td>([^<]*)</td>")
_HEAD = re.compile(r"<th>([^<]*)</th>")


def parse_tables(page: str) -> dict[str, dict[str, float]]:
    """Instruction (its assembly as the page prints it) -> {"e8m1": cycles, ...}, from every
    instruction table of an rvv-bench results page; a row left empty in one table (its
    tail/mask policy not run) is taken from the next that has it."""
    rows: dict[str, dict[str, float]] = {}
    for table in re.findall(r"<table[^>]*>(.*?)</table>", page, re.S):
        columns = _HEAD.findall(table)[1:]
        if not columns or not columns[0].startswith("e8"):
            continue
        for name, cells in _ROW.findall(table):
            values = {c: float(v) for c, v in zip(columns, _CELL.findall(cells)) if v.strip()}
            name = html.unescape(name).strip()
            if values and name not in rows:
                rows[name] = values
    return rows


def vector_kind(instruction: str) -> Optional[str]:
    """The qemu_count_plugin.cc kind of an RVV instruction by its mnemonic; None for scalar ones."""
    op = instruction.split()[0]
    if not op.startswith("v"):
        return None
    if op.startswith("vset"):
        return "config"
    if re.fullmatch(r"v[ls](e\d+|se\d+|[uo]xei\d+|\d*re\d+|\d*r|m|seg\d+e\d+|sseg\d+e\d+|[uo]xseg\d+ei\d+)"
                    r"(ff)?\.v", op):
        return "memory"
    if re.match(r"vf?w?red", op):
        return "reduction"
    if re.match(r"vrgather|vslide|vfslide|vcompress", op):
        return "permute"
    if re.match(r"vw?mul|vmacc|vnmsac|vmadd|vnmsub|vwmacc", op):
        return "multiply"
    if op.startswith("vfirst"):  # an OPMVV mask instruction despite its name
        return "integer"
    if op.startswith(("vf", "vmf")):  # OPFVV / OPFVF, the comparisons into a mask too
        return "float"
    return "integer"


def ratios(x60: dict[str, dict[str, float]], x100: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per kind ("vector": every vector instruction; "scalar": the add): the geometric mean of
    X100 / X60 cycles over the unmasked instructions both tables time at LMULS (SCALAR_LMULS
    for the add), and how many (instruction, LMUL) pairs it averages."""
    logs: dict[str, list[float]] = {"vector": []}
    for name, a in x60.items():
        b = x100.get(name)
        if b is None or name.endswith(",v0.t"):
            continue
        kind = vector_kind(name) or ("scalar" if name.split()[0] == "add" else None)
        if kind is None:
            continue
        for column in (SCALAR_LMULS if kind == "scalar" else LMULS):
            if a.get(column, 0) > 0 and b.get(column, 0) > 0:
                logs.setdefault(kind, []).append(math.log(b[column] / a[column]))
                if kind != "scalar":
                    logs["vector"].append(logs[kind][-1])
    return {k: {"ratio": math.exp(sum(v) / len(v)), "pairs": len(v)} for k, v in sorted(logs.items())}


def _commit(repo: str) -> str:
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str]) -> int:
    del argv
    pages = {}
    for core in CORES:
        path = os.path.join(FLAGS.rvv_bench_results, core, "index.html")
        if not os.path.exists(path):
            raise app.UsageError(f"{path} is missing: --rvv_bench_results must be a checkout of "
                                 "camel-cdr/rvv-bench-results")
        with open(path, encoding="utf-8") as f:
            pages[core] = parse_tables(f.read())
    result = ratios(pages["spacemit_x60"], pages["spacemit_x100"])
    print_table([{"kind": k, **v} for k, v in result.items()],
                [("kind", "kind", "s"), ("ratio", "X100 / X60 cycles", ".3f"), ("pairs", "instruction x LMUL", "d")])
    record = {"source": "github.com/camel-cdr/rvv-bench-results", "commit": _commit(FLAGS.rvv_bench_results),
              "pages": [f"{core}/index.html" for core in CORES], "lmuls": list(LMULS),
              "scalar_lmuls": list(SCALAR_LMULS), "kinds": result}
    with open(FLAGS.output, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"written: {FLAGS.output}")
    return 0


if __name__ == "__main__":
    flags.DEFINE_string("rvv_bench_results", None, "A checkout of github.com/camel-cdr/rvv-bench-results.")
    flags.DEFINE_string("output", RATIOS, "Where to write the ratios.")
    flags.mark_flag_as_required("rvv_bench_results")
    sys.exit(app.run(main))

"""Dynamic instruction counts inside the riscv64 image: packed_bf16_linear vs the
image's stock F.linear (torch 2.6, scalar ATen: `NO AVX`) on Llama-3.2-1B
shapes at M = 1 and M = 4 or, with --grid, on the shape gate's grid, under
QEMU at VLEN 256.

Method (deterministic): the image's python3.13 calls each op between two calls
of `rvascend_count_marker` under QEMU with the counting TCG plugin
(qemu_count_plugin.cc, an inline counter per translated block): every
instruction the guest executes between the markers, the Python call included.
An empty call marked the same way is subtracted, so both sides count the op
call and nothing around it. One thread on both sides.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags, logging

from rvascend.bench.plugin_intervals import read_intervals
from rvascend.bench.results import print_table, write_jsonl
from rvascend.dispatch import shape_gate

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("qemu", "/usr/bin/qemu-riscv64", "A qemu-riscv64 that loads TCG plugins (Debian 12's 7.2).")
    flags.DEFINE_string("image", None, "riscv64 image root.")
    flags.DEFINE_string("extension", None, "_rvv_kernels.so built for the image.")
    flags.DEFINE_string("package", None, "Directory holding the rvascend package sources.")
    flags.DEFINE_string("plugin", None, "qemu_count_plugin .so.")
    flags.DEFINE_list("projections", ["o_proj", "qkv_proj"], "Llama-3.2-1B projections to count.")
    flags.DEFINE_list("rows", ["1", "4"], "M values.")
    flags.DEFINE_integer("vlen", 256, "VLEN of the emulated CPU.")
    flags.DEFINE_string("output", "bench_results/image_instruction_count.jsonl", "jsonl file to append to.")
    flags.DEFINE_bool("grid", False, "Count the shape gate's grid (dispatch/shape_gate.RISCV64_GRID_*) instead of the "
                      "Llama-3.2-1B projections, and write the table the measured gate reads (--table).")
    flags.DEFINE_string("table", None, "With --grid: the gate table to write (dispatch/gate_riscv64.json).")


SHAPES = {"qkv_proj": (3072, 2048), "o_proj": (2048, 2048), "gate_up_proj": (16384, 2048),
          "down_proj": (2048, 8192), "lm_head": (128256, 2048)}

GUEST = r'''
import json, sys, torch
torch.set_num_threads(1)
import torch.nn.functional as F
from rvascend import ops
from rvascend.ops import _rvv_kernels as k
cases = json.loads(sys.argv[1])
marker = 0
def measure(fn):
    global marker
    fn()                           # first call: lazy initialisation, translation
    k.count_marker(marker); fn(); k.count_marker(marker + 1)
    marker += 2
measure(lambda: None)
for name, n, kk, m in cases:
    w = (torch.randn(n, kk) * 0.02).bfloat16(); x = torch.randn(m, kk).bfloat16()
    p = ops.pack_bf16_weight(w)
    measure(lambda: F.linear(x, w))
    measure(lambda: ops.packed_bf16_linear(x, p, n))
print("MARKERS %d" % marker, flush=True)
'''


def marked_counts(path: str) -> list[int]:
    """Instructions of every marked region: the guest's regions run from an even
    marker to the next odd one, the plugin's intervals 1, 3, 5, ..."""
    intervals = read_intervals(path)
    markers = max(intervals)  # the last interval runs from the last marker to exit
    return [sum(n for n, _ in intervals[i].values()) for i in range(1, markers, 2)]


def main(argv: list[str]) -> int:
    del argv
    image = FLAGS.image
    with tempfile.TemporaryDirectory() as tmp:
        stage = os.path.join(tmp, "stage")
        shutil.copytree(os.path.join(FLAGS.package, "rvascend"), os.path.join(stage, "rvascend"),
                        ignore=shutil.ignore_patterns("*.so", "_native", "__pycache__"))
        shutil.copy(FLAGS.extension, os.path.join(stage, "rvascend", "ops", "_rvv_kernels.so"))
        script = os.path.join(stage, "count.py")
        with open(script, "w") as f:
            f.write(GUEST)
        if FLAGS.grid:
            cases = [("grid", n, kk, m) for n in shape_gate.RISCV64_GRID_N for kk in shape_gate.RISCV64_GRID_K
                     for m in shape_gate.RISCV64_GRID_M]
        else:
            cases = [(p, *SHAPES[p], int(m)) for p in FLAGS.projections for m in FLAGS.rows]
        cpu = f"rv64,v=true,vext_spec=v1.0,vlen={FLAGS.vlen}"
        counts_path = os.path.join(tmp, "counts.txt")
        cmd = [FLAGS.qemu, "-plugin", f"{FLAGS.plugin},out={counts_path}", "-L", image, "-cpu", cpu,
               f"{image}/usr/bin/python3.13", "-B", script, json.dumps(cases)]
        env = dict(os.environ, PYTHONPATH=stage, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        logging.info("counting %d shapes under QEMU (a few minutes)", len(cases))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"guest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        counts = marked_counts(counts_path)
    if len(counts) != 1 + 2 * len(cases):
        raise RuntimeError(f"expected {1 + 2 * len(cases)} marked regions, got {len(counts)}")
    empty, counts = counts[0], [c - counts[0] for c in counts[1:]]
    logging.info("an empty marked call: %d instructions (subtracted)", empty)
    records = []
    for i, (name, n, k, m) in enumerate(cases):
        stock, ours = counts[2 * i], counts[2 * i + 1]
        records.append({"bench": "image_instruction_count", "projection": name, "n": n, "k": k, "m": m,
                        "vlen": FLAGS.vlen, "f_linear_instructions": stock, "packed_instructions": ours,
                        "ratio": stock / max(1, ours)})
    print_table(records, [("projection", "projection", "s"), ("m", "M", "d"),
                          ("f_linear_instructions", "F.linear insns", "d"),
                          ("packed_instructions", "packed insns", "d"), ("ratio", "F.linear/packed", ".1f")])
    from rvascend.repro import manifest
    captured = manifest.capture(qemu_cpu=cpu)
    write_jsonl(FLAGS.output, records, captured)
    if FLAGS.grid and FLAGS.table:
        table = {"comment": "Instructions of one BF16 Linear call inside the riscv64 image (torch 2.6, scalar "
                            "ATen) under QEMU, F.linear against the packed kernel, op call included "
                            "(bench/image_instruction_count.py --grid); the measured shape gate routes a call "
                            "to the packed kernel where it is cheaper at the nearest grid point.",
                 "vlen": FLAGS.vlen, "source_commit": captured.get("source", {}).get("commit"),
                 "points": [{k: r[k] for k in ("m", "n", "k", "f_linear_instructions", "packed_instructions")}
                            for r in records]}
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.table)), exist_ok=True)
        with open(FLAGS.table, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        logging.info("wrote %s", FLAGS.table)
    return 0


if __name__ == "__main__":
    _define_flags()
    flags.mark_flags_as_required(["image", "extension", "package", "plugin"])
    sys.exit(app.run(main))

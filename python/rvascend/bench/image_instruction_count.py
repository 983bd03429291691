"""Dynamic instruction counts inside the riscv64 image: packed_bf16_linear vs the
image's stock F.linear (torch 2.6, scalar ATen: `NO AVX`) on Llama-3.2-1B
shapes, at M = 1 and M = 4, under QEMU at VLEN 256 (target: >= 20x fewer).

Method (deterministic): the image's python3.13 runs a script that calls each
op between two calls of `rvascend_count_marker`. QEMU logs, for the code of
libtorch_cpu, libc, libm, libgomp, libstdc++ and our extension (-dfilter),
every translated block (-d in_asm) and every block execution (-d exec,nochain)
into a FIFO that exec_log_counter reads: instructions = sum over executions
inside a marked region of the block's instruction count. Threads are 1 on
both sides; QEMU reserves the guest address space (-R) and Python's hash seed
is fixed, so both runs map every library at the same address.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl

FLAGS = flags.FLAGS
flags.DEFINE_string("qemu", None, "qemu-riscv64 binary.")
flags.DEFINE_string("image", None, "riscv64 image root.")
flags.DEFINE_string("extension", None, "_rvv_kernels.so built for the image.")
flags.DEFINE_string("package", None, "Directory holding the rvascend package sources.")
flags.DEFINE_string("counter", None, "exec_log_counter binary (reads the QEMU log).")
flags.DEFINE_list("projections", ["o_proj", "qkv_proj"], "Llama-3.2-1B projections to count.")
flags.DEFINE_list("rows", ["1", "4"], "M values.")
flags.DEFINE_integer("vlen", 256, "VLEN of the emulated CPU.")
flags.DEFINE_string("output", "bench_results/image_instruction_count.jsonl", "jsonl file to append to.")

SHAPES = {"qkv_proj": (3072, 2048), "o_proj": (2048, 2048), "gate_up_proj": (16384, 2048),
          "down_proj": (2048, 8192), "lm_head": (128256, 2048)}
# Matched by prefix: the image maps versioned sonames (libtorch_cpu.so.2.6.0,
# libstdc++.so.6.0.33, libgomp.so.1.0.0, libblas.so.3.12.0).
LIBS = ("libtorch_cpu.so", "libc.so.6", "libm.so.6", "libgomp.so.1", "libstdc++.so.6", "_rvv_kernels.so",
        "libblas.so.3", "libc10.so")

GUEST = r'''
import json, sys, torch
torch.set_num_threads(1)
import torch.nn.functional as F
from rvascend import ops
from rvascend.ops import _rvv_kernels as k
maps = [l.split() for l in open("/proc/self/maps") if "r-xp" in l]
print("MAPS " + json.dumps([(m[0], m[5]) for m in maps if len(m) > 5]), flush=True)
import ctypes
lib = ctypes.CDLL(k.__file__)
print("MARKER %d" % ctypes.cast(lib.rvascend_count_marker, ctypes.c_void_p).value, flush=True)
cases = json.loads(sys.argv[1])
marker = 0
for name, n, kk, m in cases:
    w = (torch.randn(n, kk) * 0.02).bfloat16(); x = torch.randn(m, kk).bfloat16()
    p = ops.pack_bf16_weight(w)
    for fn in (lambda: F.linear(x, w), lambda: ops.packed_bf16_linear(x, p, n)):
        fn()                       # first call: lazy initialisation, translation
        k.count_marker(marker); fn(); k.count_marker(marker + 1)
        marker += 2
print("DONE", flush=True)
'''


def counted_library(path: str) -> bool:
    base = os.path.basename(path)
    return any(base == lib or base.startswith(lib + ".") for lib in LIBS)


def _ranges(maps: list[tuple[str, str]]) -> list[tuple[int, int]]:
    ranges = []
    for span, path in maps:
        lo, hi = (int(x, 16) for x in span.split("-"))
        if counted_library(path):
            ranges.append((lo, hi))
    return ranges


def _run(cmd: list[str], env: dict[str, str], log_fifo: str | None = None,
         marker_pc: int | None = None) -> tuple[str, list[int]]:
    """Runs the guest; with a FIFO, exec_log_counter reads QEMU's log while it runs."""
    counter = None
    if log_fifo is not None:
        # The counter's shell opens the FIFO (blocking until QEMU opens it for
        # writing), so this process does not block before QEMU starts.
        counter = subprocess.Popen(f"exec {shlex.quote(FLAGS.counter)} {marker_pc:x} < {shlex.quote(log_fifo)}",
                                   shell=True, stdout=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    counts = [int(x) for x in counter.communicate()[0].split()] if counter else []
    if proc.returncode != 0:
        raise RuntimeError(f"guest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout, counts


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
        cases = [(p, *SHAPES[p], int(m)) for p in FLAGS.projections for m in FLAGS.rows]
        cpu = f"rv64,v=true,vext_spec=v1.0,vlen={FLAGS.vlen}"
        # Fixed hash seed: Python's randomised hashing changes allocation sizes
        # and with them where later libraries get mapped.
        env = dict(os.environ, PYTHONPATH=stage, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        # A reserved guest address space makes QEMU place every guest mapping
        # itself, the same way in both runs (without it they follow host ASLR).
        base = [FLAGS.qemu, "-R", "0x4000000000", "-L", image, "-cpu", cpu]
        guest = [f"{image}/usr/bin/python3.13", "-B", script, json.dumps(cases)]
        # Both runs log with the same flags: QEMU's guest address layout
        # depends on them. Run 1 filters everything out; it only learns the map.
        logging.info("run 1: address map (about a minute)")
        out, _ = _run(base[:1] + ["-d", "in_asm,exec,nochain", "-dfilter", "0x1000..0x1001", "-D", os.devnull]
                      + base[1:] + guest, env, None, None)
        maps = json.loads(next(l for l in out.splitlines() if l.startswith("MAPS "))[5:])
        ranges = _ranges(maps)
        marker_pc = int(next(l for l in out.splitlines() if l.startswith("MARKER "))[7:])
        fifo = os.path.join(tmp, "exec.fifo")
        os.mkfifo(fifo)
        dfilter = ",".join(f"0x{lo:x}..0x{hi - 1:x}" for lo, hi in ranges)
        logging.info("run 2: counting (%d code ranges)", len(ranges))
        out2, counts = _run(base[:1] + ["-d", "in_asm,exec,nochain", "-dfilter", dfilter, "-D", fifo] + base[1:] +
                            guest, env, fifo, marker_pc)
        maps2 = json.loads(next(l for l in out2.splitlines() if l.startswith("MAPS "))[5:])
        if maps2 != maps:
            changed = [a for a, b in zip(maps, maps2) if a != b][:3]
            raise RuntimeError(f"the guest's address map changed between runs ({changed}); counts would be wrong")
    if len(counts) != 2 * len(cases):
        raise RuntimeError(f"expected {2 * len(cases)} marked regions, got {len(counts)}")
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
    write_jsonl(FLAGS.output, records, manifest.capture(qemu_cpu=cpu))
    return 0


if __name__ == "__main__":
    flags.mark_flags_as_required(["qemu", "image", "extension", "package", "counter"])
    sys.exit(app.run(main))

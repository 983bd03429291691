"""Dynamic instruction counts of the RVV microkernels under QEMU, per weight element.

Method (deterministic, python/rvascend/bench/qemu_exec_count.py): QEMU logs
every executed instruction inside the microkernel functions. The count is compared with the minimal vector sequence per k-row of a block:
per 32 columns load, widen, shift, FMA (4) for the version-1 shift-widening
kernels and load, widening BF16 FMA (2) with Zvfbfwma; per VLEN/2 columns
load, shift, AND and two FMAs (5) for the version-2 (rvv_wide) kernels.
"""

from __future__ import annotations

from absl import app, flags

from rvascend.bench import qemu_exec_count
from rvascend.bench.results import write_jsonl

FLAGS = flags.FLAGS

def _define_flags() -> None:
    flags.DEFINE_string("binary", None, "riscv64 bf16_packed_linear_bench binary.")
    flags.DEFINE_string("qemu", None, "qemu-riscv64 to run it with.")
    flags.DEFINE_string("nm", "llvm-nm-19", "nm that reads riscv64 ELF files.")
    flags.DEFINE_list("vlens", ["256"], "VLENs to count at.")
    flags.DEFINE_list("shapes", ["1x2048x2048", "4x2048x2048"], "MxNxK shapes.")
    flags.DEFINE_list("kernel_sets", ["rvv_wide", "rvv", "zvfbfwma"], "Kernel sets to count.")
    flags.DEFINE_string("output", None, "Append one JSON line per count to this file.")

def minimal_per_weight(kernel_set: str, vlen: int) -> float:
    """Vector instructions per weight element of the shortest sequence the set's layout allows."""
    return {"rvv": 4 / 32, "zvfbfwma": 2 / 32, "rvv_wide": 5 / (vlen / 2)}[kernel_set]
_KERNEL_SYMBOLS = r"rvascend::.*(ukernel|Gemv|Gemm|BlockPair|Lmul)"


def main(argv: list[str]) -> int:
    del argv
    ranges = qemu_exec_count.function_ranges(FLAGS.binary, FLAGS.nm, _KERNEL_SYMBOLS)
    rows = []
    print(f"{'kernels':10s} {'VLEN':>5s} {'M':>4s} {'N':>6s} {'K':>6s} {'insns':>12s} "
          f"{'per weight':>11s} {'minimum':>9s} {'ratio':>6s} {'x 16/VLEN':>9s}")
    for kernel_set in FLAGS.kernel_sets:
        cpu_ext = ",zfbfmin=true,zvfbfmin=true,zvfbfwma=true" if kernel_set == "zvfbfwma" else ""
        for vlen in FLAGS.vlens:
            cpu = f"rv64,v=true,vext_spec=v1.0,vlen={vlen}{cpu_ext}"
            for shape in FLAGS.shapes:
                m, n, k = (int(x) for x in shape.split("x"))
                insns = qemu_exec_count.count(FLAGS.binary, FLAGS.qemu, cpu,
                              [f"--kernel_set={kernel_set}", f"--m={m}", f"--n={n}", f"--k={k}",
                               "--reps=1", "--threads=1"], ranges)
                minimum = minimal_per_weight(kernel_set, int(vlen)) * n * k
                row = {"bench": "rvv_instruction_count", "kernel_set": kernel_set, "vlen": int(vlen),
                       "m": m, "n": n, "k": k, "instructions": insns,
                       "instructions_per_weight": insns / (n * k),
                       "minimal_instructions_m1": minimum, "ratio_to_minimum_per_row": insns / (m * minimum),
                       "ratio_to_16_over_vlen": insns / (m * n * k) / (16 / int(vlen))}
                rows.append(row)
                print(f"{kernel_set:10s} {vlen:>5s} {m:4d} {n:6d} {k:6d} {insns:12d} "
                      f"{insns / (n * k):11.4f} {minimum / (n * k):9.4f} {insns / (m * minimum):6.2f} "
                      f"{row['ratio_to_16_over_vlen']:9.2f}")
    if FLAGS.output:
        write_jsonl(FLAGS.output, rows)
    return 0


if __name__ == "__main__":
    _define_flags()
    flags.mark_flags_as_required(["binary", "qemu"])
    app.run(main)

"""Dynamic instruction counts of attention over the KV pool under QEMU, per MAC.

Method (deterministic, python/rvascend/bench/qemu_exec_count.py): QEMU logs every
executed instruction inside the project's functions (driver and kernels), for one
call of one sequence. Each prefill shape is counted with the block kernel (`rvv`)
and with the decode row kernel on every row (`rvv_rows`), side by side; a decode
row (rows = 1) runs the row kernel either way.
"""

from __future__ import annotations

from absl import app, flags

from rvascend.bench import qemu_exec_count
from rvascend.bench.results import write_jsonl

FLAGS = flags.FLAGS

def _define_flags() -> None:
    flags.DEFINE_string("binary", None, "riscv64 kv_pool_attention_bench binary.")
    flags.DEFINE_string("qemu", None, "qemu-riscv64 to run it with.")
    flags.DEFINE_string("nm", "llvm-nm-19", "nm that reads riscv64 ELF files.")
    flags.DEFINE_list("vlens", ["256"], "VLENs to count at.")
    flags.DEFINE_list("shapes", ["qwen3-0.6b:0:64", "qwen3-0.6b:448:64", "smollm2-135m:0:64", "smollm2-135m:0:256",
                                 "qwen3-0.6b:511:1"],
                      "MODEL:PREFIX:ROWS: ROWS new query rows after PREFIX cached tokens.")
    flags.DEFINE_list("kernels", ["rvv", "rvv_rows"], "Attention kernels to count.")
    flags.DEFINE_string("output", None, "Append one JSON line per count to this file.")

# heads, kv_heads, head_dim
_MODELS = {"qwen3-0.6b": (16, 8, 128), "smollm2-135m": (9, 3, 64), "llama-3.2-1b": (32, 8, 64)}


def main(argv: list[str]) -> int:
    del argv
    ranges = qemu_exec_count.function_ranges(FLAGS.binary, FLAGS.nm, r"rvascend::")
    rows_out = []
    print(f"{'shape':22s} {'VLEN':>5s} {'kernel':9s} {'insns':>12s} {'per MAC':>8s} {'vs rvv_rows':>11s}")
    for vlen in FLAGS.vlens:
        cpu = f"rv64,v=true,vext_spec=v1.0,vlen={vlen}"
        for shape in FLAGS.shapes:
            model, prefix, rows = shape.split(":")
            if model not in _MODELS:
                raise app.UsageError(f"unknown model {model!r} in --shapes (known: {', '.join(_MODELS)})")
            heads, kv_heads, d = _MODELS[model]
            prefix, rows = int(prefix), int(rows)
            macs = 2 * heads * d * (rows * prefix + rows * (rows + 1) // 2)
            counts = {}
            for kernel in FLAGS.kernels:
                counts[kernel] = qemu_exec_count.count(
                    FLAGS.binary, FLAGS.qemu, cpu,
                    [f"--kernel={kernel}", f"--heads={heads}", f"--kv_heads={kv_heads}", f"--d={d}",
                     f"--prefix={prefix}", f"--rows={rows}", "--reps=1", "--threads=1"], ranges)
            base = counts.get("rvv_rows")
            for kernel, insns in counts.items():
                row = {"bench": "attention_instruction_count", "model": model, "prefix": prefix, "rows": rows,
                       "vlen": int(vlen), "kernel": kernel, "instructions": insns, "macs": macs,
                       "instructions_per_mac": insns / macs}
                rows_out.append(row)
                ratio = f"{base / insns:10.2f}x" if base else ""
                print(f"{shape:22s} {vlen:>5s} {kernel:9s} {insns:12d} {insns / macs:8.4f} {ratio:>11s}")
    if FLAGS.output:
        write_jsonl(FLAGS.output, rows_out)
    return 0


if __name__ == "__main__":
    _define_flags()
    flags.mark_flags_as_required(["binary", "qemu"])
    app.run(main)

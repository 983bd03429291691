"""Dynamic instruction counts of one decode token of recurrent_gated_delta_rule under QEMU.

Method (deterministic, python/rvascend/bench/qemu_exec_count.py): QEMU logs every
instruction executed inside the op's functions (namespace rgdr: the units, the
row kernels) for one call with one token per sequence, once with the RVV rows
and once with the portable ones, side by side. Reported per state element
(B x NV x Dv x Dk), against a floor: per VL elements of a state row, one load
and one store of the state, one FMA of the rank-one update and one of each of
the two dot products (r . k and r . q), five vector instructions, with VL = 4 x
VLEN / 32 (the kernel's e32m4). The floor ignores loads of k and q and loop
overhead, so no kernel reaches it.
"""

from __future__ import annotations

from absl import app, flags

from rvascend.bench import qemu_exec_count
from rvascend.bench.results import write_jsonl

FLAGS = flags.FLAGS

def _define_flags() -> None:
    flags.DEFINE_string("binary", None, "riscv64 recurrent_gated_delta_rule_decode_bench binary.")
    flags.DEFINE_string("qemu", None, "qemu-riscv64 to run it with.")
    flags.DEFINE_string("nm", "llvm-nm-19", "nm that reads riscv64 ELF files.")
    flags.DEFINE_list("vlens", ["128", "256", "512"], "VLENs to count at.")
    flags.DEFINE_list("shapes", ["qwen3.5-0.8b:1", "qwen3.5-0.8b:4", "qwen3-next:1"],
                      "MODEL:B: B sequences of one token each.")
    flags.DEFINE_list("elems", ["f32", "bf16"], "State element types.")
    flags.DEFINE_list("rows", ["rvv", "portable"], "Row kernels to count.")
    flags.DEFINE_string("output", None, "Append one JSON line per count to this file.")

_LMUL = 4
_FLOOR_PER_VL = 5  # state load + store, rank-one FMA, two dot-product FMAs
# nk, nv, dk, dv
_MODELS = {"qwen3.5-0.8b": (16, 16, 128, 128), "qwen3-next": (16, 32, 128, 128)}


def main(argv: list[str]) -> int:
    del argv
    # The op's functions; not the bench's own input generation (its signature names rgdr::Elem).
    ranges = qemu_exec_count.function_ranges(FLAGS.binary, FLAGS.nm, r"rgdr::", exclude=r"::Random\(")
    out = []
    print(f"{'shape':18s} {'VLEN':>5s} {'elem':5s} {'rows':9s} {'insns':>10s} {'per elem':>9s} {'floor':>7s} "
          f"{'x floor':>8s}")
    for vlen in FLAGS.vlens:
        cpu = f"rv64,v=true,vext_spec=v1.0,vlen={vlen}"
        floor = _FLOOR_PER_VL / (_LMUL * int(vlen) / 32)
        for shape in FLAGS.shapes:
            model, b = shape.split(":")
            if model not in _MODELS:
                raise app.UsageError(f"unknown model {model!r} in --shapes (known: {', '.join(_MODELS)})")
            nk, nv, dk, dv = _MODELS[model]
            elements = int(b) * nv * dv * dk
            for elem in FLAGS.elems:
                for rows in FLAGS.rows:
                    insns = qemu_exec_count.count(
                        FLAGS.binary, FLAGS.qemu, cpu,
                        [f"--elem={elem}", f"--b={b}", f"--nk={nk}", f"--nv={nv}", f"--dk={dk}", f"--dv={dv}",
                         f"--rows={rows}", "--reps=1", "--threads=1"], ranges)
                    per = insns / elements
                    out.append({"bench": "recurrent_gated_delta_rule_instruction_count", "model": model,
                                "b": int(b), "vlen": int(vlen), "elem": elem, "rows": rows, "instructions": insns, "state_elements": elements,
                                "instructions_per_element": per, "floor_per_element": floor})
                    print(f"{shape:18s} {vlen:>5s} {elem:5s} {rows:9s} {insns:10d} {per:9.4f} {floor:7.4f} "
                          f"{per / floor:8.2f}")
    if FLAGS.output:
        write_jsonl(FLAGS.output, out)
    return 0


if __name__ == "__main__":
    _define_flags()
    flags.mark_flags_as_required(["binary", "qemu"])
    app.run(main)

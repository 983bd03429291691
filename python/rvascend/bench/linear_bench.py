"""packed_bf16_linear vs F.linear on Llama-3.2-1B projection shapes, and M=1 bandwidth.

For every (projection, M) both ops run interleaved with the same thread count;
the table shows time(packed) / time(F.linear) (target <= 1.0 for M <= 16).
For M = 1 it also shows the packed weight's read rate divided by the copy
bandwidth measured in the same run (STREAM convention: a copy of S bytes moves
2*S bytes; target >= 0.8 for weights larger than the last-level cache).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from absl import app, flags, logging

from rvascend import ops
from rvascend.bench.results import print_table, write_jsonl
from rvascend.bench.timing import copy_bandwidth, time_calls

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("rows", ["1", "2", "4", "8", "16", "64"], "M values (rows of the input).")
    flags.DEFINE_list("projections", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"],
                      "Which Llama-3.2-1B projections to run.")
    flags.DEFINE_integer("threads", None, "torch intra-op threads (default: torch's).")
    flags.DEFINE_string("kernel_set", None, "Pin a kernel set (default: the best available).")
    flags.DEFINE_float("min_seconds", 0.3, "Minimum measuring time per op and shape.")
    flags.DEFINE_string("output", None, "Append jsonl records here.")


# (out_features N, in_features K) of Llama-3.2-1B's fused projections.
LLAMA_3_2_1B = {
    "qkv_proj": (3072, 2048),
    "o_proj": (2048, 2048),
    "gate_up_proj": (16384, 2048),
    "down_proj": (2048, 8192),
    "lm_head": (128256, 2048),
}


def run(rows: list[int], projections: list[str], min_seconds: float) -> list[dict]:
    records = []
    bandwidth = copy_bandwidth()
    logging.info("copy bandwidth %.1f GB/s, %d threads, kernels %s", bandwidth / 1e9,
                 torch.get_num_threads(), ops.available_kernel_sets()[0])
    for name in projections:
        n, k = LLAMA_3_2_1B[name]
        weight = (torch.randn(n, k) / k ** 0.5).bfloat16()
        packed = ops.pack_bf16_weight(weight)
        for m in rows:
            x = torch.randn(m, k).bfloat16()
            t_ref, t_packed = time_calls(
                [lambda: F.linear(x, weight), lambda: ops.packed_bf16_linear(x, packed, n)],
                min_seconds=min_seconds)
            record = {
                "bench": "packed_linear", "projection": name, "m": m, "n": n, "k": k,
                "threads": torch.get_num_threads(), "f_linear_s": t_ref, "packed_s": t_packed,
                "ratio": t_packed / t_ref,
            }
            if m == 1:
                weight_rate = packed.numel() * 2 / t_packed
                record.update(weight_gbps=weight_rate / 1e9, copy_gbps=bandwidth / 1e9,
                              bandwidth_fraction=weight_rate / bandwidth)
            records.append(record)
            logging.info("%s M=%d: %.3f ms vs %.3f ms", name, m, t_packed * 1e3, t_ref * 1e3)
        del weight, packed
    return records


def main(argv: list[str]) -> int:
    del argv
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    rows = [int(r) for r in FLAGS.rows]
    if FLAGS.kernel_set:
        with ops.use_kernel_set(FLAGS.kernel_set):
            records = run(rows, FLAGS.projections, FLAGS.min_seconds)
    else:
        records = run(rows, FLAGS.projections, FLAGS.min_seconds)
    print_table(records, [("projection", "projection", "s"), ("m", "M", "d"),
                          ("f_linear_s", "F.linear s", ".6f"), ("packed_s", "packed s", ".6f"),
                          ("ratio", "packed/F", ".2f"), ("weight_gbps", "weight GB/s", ".1f"),
                          ("bandwidth_fraction", "of copy BW", ".2f")])
    if FLAGS.output:
        from rvascend.repro import manifest
        write_jsonl(FLAGS.output, records, manifest.capture())
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

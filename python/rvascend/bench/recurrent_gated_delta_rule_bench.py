"""recurrent_gated_delta_rule per decode step: this CPU op vs transformers'
`torch_recurrent_gated_delta_rule`, at Qwen3-Next shapes (NK 16, NV 32,
Dk = Dv = 128), batch 1 / 8 / 32, MTP 1 and 4 (target ratio >= 20x); the op's
effective bandwidth against a plain copy of the same bytes timed in the same
run (state bytes read + written per call; a copy of S bytes moves 2 S, so the
op is compared with a copy of half its bytes; target >= 0.5 for B >= 8), hot
(the same bytes every call, cache-resident when they fit) and cold (calls
cycle through --cold-bytes of copies, so the bytes come from memory, as in a
model between two calls of one layer); and
the AscendC kernel on the CPU twin: DMA bytes against the minimum traffic,
vector instructions and V->S syncs per token and 128 state rows.
"""

from __future__ import annotations

import itertools
import sys

import torch
from absl import app, flags

import rvascend.ops.recurrent_gated_delta_rule as R
from rvascend.bench.results import print_table, write_jsonl
from rvascend.bench.timing import time_calls

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("batches", ["1", "8", "32"], "Sequences per step.")
    flags.DEFINE_list("mtp", ["1", "4"], "Tokens per sequence.")
    flags.DEFINE_integer("cold-bytes", 256 << 20,
                         "Bytes the cold runs cycle through (several times the last-level cache).")
    flags.DEFINE_string("output", "bench_results/recurrent_gated_delta_rule.jsonl", "jsonl file to append to.")


NK, NV, DK, DV = 16, 32, 128, 128


def inputs(batch: int, mtp: int, dtype=torch.bfloat16):
    T = batch * mtp
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(T, NK, DK, generator=g), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(T, NK, DK, generator=g), dim=-1).to(dtype)
    return dict(query=q, key=k, value=torch.randn(T, NV, DV, generator=g).to(dtype),
                state=(torch.randn(T, NV, DV, DK, generator=g) * 0.1).to(dtype),
                beta=torch.rand(T, NV, generator=g).to(dtype), scale=DK ** -0.5,
                actual_seq_lengths=torch.full((batch,), mtp, dtype=torch.int32),
                ssm_state_indices=torch.arange(T, dtype=torch.int32), g=-torch.rand(T, NV, generator=g))


def main(argv: list[str]) -> int:
    del argv
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as hf
    rows = R.available_row_kernels("bfloat16")[0]
    records = []
    for batch in (int(b) for b in FLAGS.batches):
        for mtp in (int(m) for m in FLAGS.mtp):
            a = inputs(batch, mtp)
            hq = a["query"].reshape(batch, mtp, NK, DK)
            hk = a["key"].reshape(batch, mtp, NK, DK)
            hv = a["value"].reshape(batch, mtp, NV, DV)
            hb = a["beta"].reshape(batch, mtp, NV)
            hg = a["g"].reshape(batch, mtp, NV)
            init = a["state"][::mtp].float().transpose(-1, -2).contiguous()
            T, e = batch * mtp, 2
            state = NV * DV * DK * e
            moved = (batch + T) * state  # the states read (one per sequence) and written (one per token)
            # Each timed in its own loop: alternating call by call would make the op's thread
            # pool and torch's OpenMP workers (both poll a while before they sleep) fight
            # over the cores, which measures the alternation rather than either of them.
            (t_hf,) = time_calls([lambda: hf(hq, hk, hv, g=hg, beta=hb, initial_state=init,
                                             output_final_state=True)], min_seconds=0.5)
            # Hot: the same bytes every call (they stay in the last-level cache when they fit).
            # Cold: calls cycle through enough copies that every call's bytes come from memory,
            # as in a model, where the other layers run between two calls of one layer.
            copies = max(1, -(-FLAGS["cold-bytes"].value // moved))
            pools = [dict(a, state=a["state"].clone()) for _ in range(copies)]
            srcs = [torch.ones(moved // 4, dtype=torch.bfloat16) for _ in range(copies)]
            dsts = [torch.empty_like(x) for x in srcs]
            turn = itertools.count()
            (t_copy,) = time_calls([lambda: dsts[0].copy_(srcs[0])], min_seconds=0.5)
            (t_op,) = time_calls([lambda: R.recurrent_gated_delta_rule(**a)], min_seconds=0.5)
            (t_copy_cold,) = time_calls([lambda: (lambda i: dsts[i].copy_(srcs[i]))(next(turn) % copies)],
                                        min_seconds=0.5)
            (t_op_cold,) = time_calls([lambda: R.recurrent_gated_delta_rule(**pools[next(turn) % copies])],
                                      min_seconds=0.5)
            del pools, srcs, dsts
            _, counters, _ = R.run_on_twin(**{**a, "state": a["state"].clone()})
            io = T * (2 * NK * DK + 2 * NV * DV + NV) * e + T * NV * 4  # q, k, v, out, beta, g
            per_seq = batch * 2 * state + io       # one state read + one write per sequence
            contract = batch * state + T * state + io  # one read + one write per token (the op's contract)
            dma = counters["dma_in_bytes"] + counters["dma_out_bytes"]
            # The kernel's work per token and 128 state rows (one value head of Qwen3-Next).
            per_token_chunk = T * NV * DV / 128
            records.append({"bench": "recurrent_gated_delta_rule_decode", "batch": batch, "mtp": mtp, "hf_s": t_hf,
                            "op_s": t_op, "speedup": t_hf / t_op, "state_bytes_moved": moved,
                            "op_gbps": moved / t_op / 1e9, "copy_gbps": moved / t_copy / 1e9,
                            "bandwidth_fraction": t_copy / t_op, "op_cold_s": t_op_cold,
                            "op_cold_gbps": moved / t_op_cold / 1e9, "copy_cold_gbps": moved / t_copy_cold / 1e9,
                            "bandwidth_fraction_cold": t_copy_cold / t_op_cold, "twin_dma_bytes": dma,
                            "dma_per_token_vs_per_sequence_minimum": dma / per_seq,
                            "dma_vs_contract_minimum": dma / contract,
                            "twin_vector_calls_per_token_chunk": counters["vector_calls"] / per_token_chunk,
                            "twin_vector_repeats_per_token_chunk": counters["vector_repeats"] / per_token_chunk,
                            "twin_scalar_syncs_per_token_chunk": counters["scalar_syncs"] / per_token_chunk,
                            "threads": torch.get_num_threads(), "row_kernels": rows})
    print_table(records, [("row_kernels", "rows", "s"), ("threads", "threads", "d"), ("batch", "batch", "d"),
                          ("mtp", "MTP", "d"), ("hf_s", "HF s", ".6f"), ("op_s", "op s", ".6f"),
                          ("speedup", "HF/op", ".1f"),
                          ("op_gbps", "op GB/s", ".1f"), ("copy_gbps", "copy GB/s", ".1f"),
                          ("bandwidth_fraction", "op/copy hot", ".2f"),
                          ("op_cold_gbps", "op GB/s cold", ".1f"), ("copy_cold_gbps", "copy GB/s cold", ".1f"),
                          ("bandwidth_fraction_cold", "op/copy cold", ".2f"),
                          ("dma_per_token_vs_per_sequence_minimum", "DMA/min(seq)", ".3f"),
                          ("dma_vs_contract_minimum", "DMA/min(tok)", ".3f"),
                          ("twin_vector_calls_per_token_chunk", "vec instr/tok/128 rows", ".1f"),
                          ("twin_scalar_syncs_per_token_chunk", "V->S syncs/tok/128 rows", ".2f")])
    from rvascend.repro import manifest
    write_jsonl(FLAGS.output, records, manifest.capture())
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

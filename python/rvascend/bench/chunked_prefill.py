"""Inter-token latency of running requests while a long prompt arrives, by chunked-prefill size.

Per size: `--decoders` requests decode; their step times are measured for a while
(baseline ITL), then one prompt of `--long-input-len` tokens arrives and every step
is timed until its first token (ITL of the decoders during that prefill; the long
prompt's TTFT). Each step is timed by itself; P50/P99 and the ratio of P99 during
the long prefill to the baseline P99 (SGLang's --chunked-prefill-size; target <= 2).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch
from absl import app, flags, logging

from rvascend.bench import engine_model
from rvascend.bench.results import percentile, print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    engine_model.define_flags(policy="on")
    flags.DEFINE_list("sizes", ["-1", "512", "128", "64", "32"], "Chunked-prefill sizes (-1: whole prompts).")
    flags.DEFINE_integer("decoders", 4, "Requests decoding while the long prompt arrives.")
    flags.DEFINE_integer("long-input-len", 3968, "Tokens of the long prompt.")
    flags.DEFINE_integer("baseline-steps", 24, "Decode steps timed before the long prompt arrives.")
    flags.DEFINE_string("output", "bench_results/chunked_prefill.jsonl", "jsonl file to append to.")


def run(model, size: int, decoders: int, long_len: int, baseline_steps: int) -> dict[str, Any]:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    engine = Engine(model, None, EngineConfig(max_total_tokens=long_len + 64 + decoders * 1024,
                                              max_running_requests=decoders + 1, chunked_prefill_size=size))
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)
    for _ in range(decoders):
        engine.add_request(torch.randint(0, vocab, (16,), generator=g).tolist(), params)
    for _ in range(4):  # prefill and warm-up
        engine.step()

    def timed_step() -> float:
        t0 = time.perf_counter()
        engine.step()
        return time.perf_counter() - t0

    baseline = [timed_step() for _ in range(baseline_steps)]
    long = engine.add_request(torch.randint(0, vocab, (long_len,), generator=g).tolist(),
                              SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    arrival = time.perf_counter()
    during = []
    while not long.output_ids:
        during.append(timed_step())
    ttft = time.perf_counter() - arrival
    return {"chunked_prefill_size": size, "decoders": decoders, "long_input_len": long_len,
            "baseline_p50_itl_ms": 1e3 * statistics.median(baseline), "baseline_p99_itl_ms": 1e3 * percentile(baseline, 99),
            "during_p50_itl_ms": 1e3 * statistics.median(during), "during_p99_itl_ms": 1e3 * percentile(during, 99),
            "p99_itl_ratio": percentile(during, 99) / percentile(baseline, 99),
            "long_prompt_ttft_s": ttft, "steps_during": len(during)}


def main(argv: list[str]) -> int:
    del argv
    path, model = engine_model.load()
    records = []
    for size in (int(s) for s in FLAGS.sizes):
        logging.info("chunked prefill size %d", size)
        records.append({"model_path": path, "threads": torch.get_num_threads(), "policy": FLAGS.policy,
                        **run(model, size, FLAGS.decoders, FLAGS["long-input-len"].value,
                              FLAGS["baseline-steps"].value)})
    print_table(records, [("chunked_prefill_size", "chunk", "d"), ("baseline_p99_itl_ms", "base P99 ms", ".1f"),
                          ("during_p50_itl_ms", "P50 ms", ".1f"), ("during_p99_itl_ms", "P99 ms", ".1f"),
                          ("p99_itl_ratio", "P99 x", ".2f"), ("long_prompt_ttft_s", "long TTFT s", ".2f"),
                          ("steps_during", "steps", "d")])
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

"""Time per output token late in a long answer vs early, at batch 1.

One request with a short prompt generates `--output-len` tokens through the
engine with its tokenizer (incremental detokenization and stop-string checks
included, as served); every engine step is timed by itself. Reported: the median
step time around output token 16 and around token 512 (a window of `--window`
steps each) and their ratio (target <= 1.1: anything that grows with the output,
such as re-decoding the whole text per token, shows here).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from absl import app, flags, logging

from rvascend.bench import engine_model
from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.tokenizer.tokenizer import Tokenizer

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    engine_model.define_flags(policy="off")
    flags.DEFINE_list("at", ["16", "512"], "Output tokens around which step times are compared (early, late).")
    flags.DEFINE_integer("window", 32, "Steps timed around each point.")
    flags.DEFINE_string("output", "bench_results/long_output.jsonl", "jsonl file to append to.")


def run(model, tokenizer, prompt: list[int], early: int, late: int, window: int) -> dict[str, float]:
    half = window // 2
    output_len = late + half + 1
    engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=len(prompt) + output_len + 64))
    # Stop strings that never match: their check runs on every token, as served.
    params = SamplingParams(max_tokens=output_len, temperature=0.8, seed=0, ignore_eos=True,
                            stop=("\n\n\n\n\n\n", "THE END.") if tokenizer is not None else ())
    seq = engine.add_request(prompt, params)
    times: dict[int, float] = {}  # output tokens before the step -> its seconds
    while engine.has_work():
        before = len(seq.output_ids)
        t0 = time.perf_counter()
        engine.step()
        times[before] = time.perf_counter() - t0
    if len(seq.output_ids) != output_len:
        raise RuntimeError(f"the request ended early: {seq.finish_reason} {seq.error or ''}")

    def around(n: int) -> float:
        return statistics.median(times[i] for i in range(max(1, n - half), n + half))

    logging.info("%d output tokens, %d characters of text", output_len, len(seq.text))
    return {"early_ms_per_token": 1e3 * around(early), "late_ms_per_token": 1e3 * around(late),
            "late_over_early": around(late) / around(early), "output_chars": len(seq.text)}


def main(argv: list[str]) -> int:
    del argv
    path, model = engine_model.load()
    early, late = (int(x) for x in FLAGS.at)
    tokenizer = Tokenizer(path)
    prompt = tokenizer.encode("Write a long story about a lighthouse keeper.")
    records = []
    for served in (False, True):
        record = {"model_path": path, "threads": torch.get_num_threads(), "policy": FLAGS.policy,
                  "detokenize": "on" if served else "off", "prompt_tokens": len(prompt), "early_token": early, "late_token": late,
                  **run(model, tokenizer if served else None, prompt, early, late, FLAGS.window)}
        records.append(record)
    print_table(records, [("detokenize", "text", "s"), ("early_token", "early at", "d"),
                          ("early_ms_per_token", "ms/token", ".2f"), ("late_token", "late at", "d"),
                          ("late_ms_per_token", "ms/token", ".2f"), ("late_over_early", "late / early", ".3f")])
    print("'text' off: the model and engine alone (attention grows with the context); on: as served, with "
          "incremental detokenization and stop-string checks on every token")
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

"""Time to first token with a shared system prompt, prefix cache on vs off.

`--concurrency` clients each send `--requests-per-client` requests one after the
other: the same `--system-len`-token system prompt followed by a distinct
`--question-len`-token question, `--output-len` tokens out. The engine runs in
its own thread as in the server. TTFT is each request's arrival to its first
token (the engine's own timestamps); the first request of each client is part of
the measurement (it finds the cache cold or filling). Reported: mean and P50/P99
TTFT per setting, the cache hit rate, and the ratio of mean TTFT off / on
(SGLang's radix cache; target >= 5).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any

import torch
from absl import app, flags, logging

from rvascend.bench import engine_model
from rvascend.bench.results import percentile, print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.sequence import Sequence

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    engine_model.define_flags(policy="off")
    flags.DEFINE_integer("system-len", 1024, "Tokens of the shared system prompt.")
    flags.DEFINE_integer("question-len", 24, "Tokens of each distinct question.")
    flags.DEFINE_integer("output-len", 8, "Tokens generated per request.")
    flags.DEFINE_integer("concurrency", 4, "Clients sending at the same time.")
    flags.DEFINE_integer("requests-per-client", 6, "Requests each client sends, one after the other.")
    flags.DEFINE_string("output", "bench_results/prefix_cache.jsonl", "jsonl file to append to.")


def _client(engine: Engine, prompts: list[list[int]], params: SamplingParams, done: list[Sequence]) -> None:
    for prompt in prompts:
        finished = threading.Event()
        seq = engine.add_request(prompt, params, lambda s, out: out.finished and finished.set())
        finished.wait()
        if seq.error:
            raise RuntimeError(seq.error)
        done.append(seq)


def run(model, cache: bool, system: list[int], questions: list[list[list[int]]], output_len: int) -> dict[str, Any]:
    longest = len(system) + max(len(q) for qs in questions for q in qs) + output_len
    engine = Engine(model, None, EngineConfig(max_total_tokens=len(questions) * longest + 64,
                                              max_running_requests=len(questions), disable_radix_cache=not cache))
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    stop = threading.Event()
    worker = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
    worker.start()
    done: list[Sequence] = []
    start = time.perf_counter()
    clients = [threading.Thread(target=_client, args=(engine, [system + q for q in qs], params, done))
               for qs in questions]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.perf_counter() - start
    stop.set()
    worker.join()
    ttft = [s.first_token_time - s.arrival for s in done]
    return {"prefix_cache": "on" if cache else "off", "requests": len(done), "mean_ttft_s": statistics.fmean(ttft),
            "p50_ttft_s": statistics.median(ttft), "p99_ttft_s": percentile(ttft, 99),
            "cache_hit_rate": engine.stats()["cache_hit_rate"],
            "cached_prompt_share": sum(s.cached_tokens for s in done) / sum(len(s.prompt_ids) for s in done),
            "wall_s": wall}


def main(argv: list[str]) -> int:
    del argv
    path, model = engine_model.load()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    system = torch.randint(0, vocab, (FLAGS["system-len"].value,), generator=g).tolist()
    questions = [[torch.randint(0, vocab, (FLAGS["question-len"].value,), generator=g).tolist()
                  for _ in range(FLAGS["requests-per-client"].value)] for _ in range(FLAGS.concurrency)]
    # A warm-up run (first-call work), then off and on side by side.
    run(model, True, system, [qs[:1] for qs in questions[:1]], FLAGS["output-len"].value)
    records = []
    for cache in (False, True):
        logging.info("prefix cache %s", "on" if cache else "off")
        records.append({"model_path": path, "threads": torch.get_num_threads(), "policy": FLAGS.policy,
                        "system_len": len(system), "question_len": FLAGS["question-len"].value,
                        "concurrency": FLAGS.concurrency, "output_len": FLAGS["output-len"].value,
                        **run(model, cache, system, questions, FLAGS["output-len"].value)})
    off, on = records
    on["mean_ttft_ratio_off_over_on"] = off["mean_ttft_s"] / on["mean_ttft_s"]
    print_table(records, [("prefix_cache", "cache", "s"), ("requests", "requests", "d"),
                          ("mean_ttft_s", "mean TTFT s", ".3f"), ("p50_ttft_s", "P50 s", ".3f"),
                          ("p99_ttft_s", "P99 s", ".3f"), ("cache_hit_rate", "hit rate", ".1%"),
                          ("wall_s", "wall s", ".1f")])
    print(f"mean TTFT without / with the prefix cache: {on['mean_ttft_ratio_off_over_on']:.1f}x")
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

"""Serving benchmark (SGLang bench_serving's metrics) against a fresh server.

Starts `serve` as a subprocess for each configuration (policy off / on), then
for each concurrency (1, then 2) sends warm-up requests and a fixed number of
measured streaming requests of `input-len` random prompt tokens and exactly
`output-len` generated tokens. Reports request/input/output/total throughput,
E2E, TTFT and ITL (mean, median, P99), per-request decode rate, benchmark
wall time and the server's peak RSS (VmHWM).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import httpx
from absl import app, flags, logging

from rvascend.bench.plots import bar_plot
from rvascend.bench.results import percentile, print_table, write_jsonl
from rvascend.testing.rss import peak_rss_mib
from rvascend.server.loopback import server_process

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("model-path", None, "Checkpoint directory (default: the random-weight test model).")
    flags.DEFINE_list("concurrency", ["1", "2"], "Concurrency levels, in order, on the same server.")
    flags.DEFINE_integer("num-prompts", 4, "Measured requests per concurrency level.")
    flags.DEFINE_integer("warmup-requests", 2, "Unmeasured requests before each level.")
    flags.DEFINE_integer("input-len", 64, "Prompt tokens.")
    flags.DEFINE_integer("output-len", 8, "Generated tokens (EOS ignored).")
    flags.DEFINE_list("policy", ["off", "on"], "Server runs: RVV policy off and/or on.")
    flags.DEFINE_string("server-args", "", "Extra flags for the server, space-separated.")
    flags.DEFINE_string("output", "bench_results/serving.jsonl", "jsonl file to append to.")
    flags.DEFINE_string("plot", "bench_results/serving.png", "PNG plot (empty: none).")


def _one_request(url: str, prompt: list[int], output_len: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "stream": True, "ignore_eos": True}
    start = time.perf_counter()
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    end = time.perf_counter()
    return {"start": start, "end": end, "chunks": times}


def _level(url: str, concurrency: int, n: int, warmup: int, input_len: int, output_len: int,
           vocab: int) -> dict[str, Any]:
    rng = random.Random(concurrency)
    prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(n + warmup)]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda p: _one_request(url, p, output_len), prompts[:warmup]))
        wall0 = time.perf_counter()
        results = list(pool.map(lambda p: _one_request(url, p, output_len), prompts[warmup:]))
        wall = time.perf_counter() - wall0
    e2e = [r["end"] - r["start"] for r in results]
    ttft = [r["chunks"][0] - r["start"] for r in results if r["chunks"]]
    itl = [b - a for r in results for a, b in zip(r["chunks"], r["chunks"][1:])]
    decode_rate = [(len(r["chunks"]) - 1) / (r["chunks"][-1] - r["chunks"][0])
                   for r in results if len(r["chunks"]) > 1]
    out_tokens = n * output_len
    return {
        "max_concurrency": concurrency, "completed": n, "benchmark_duration": wall,
        "request_throughput": n / wall, "input_throughput": n * input_len / wall,
        "output_throughput": out_tokens / wall, "total_throughput": n * (input_len + output_len) / wall,
        "mean_e2e_latency_ms": 1e3 * statistics.mean(e2e), "median_e2e_latency_ms": 1e3 * statistics.median(e2e),
        "p99_e2e_latency_ms": 1e3 * percentile(e2e, 99),
        "mean_ttft_ms": 1e3 * statistics.mean(ttft), "median_ttft_ms": 1e3 * statistics.median(ttft),
        "p99_ttft_ms": 1e3 * percentile(ttft, 99),
        "mean_itl_ms": 1e3 * statistics.mean(itl) if itl else float("nan"),
        "median_itl_ms": 1e3 * statistics.median(itl) if itl else float("nan"),
        "p99_itl_ms": 1e3 * percentile(itl, 99),
        "mean_decode_tok_per_s_per_request": statistics.mean(decode_rate) if decode_rate else float("nan"),
    }


def run_server(policy: str, model_path: str, extra: list[str]) -> list[dict[str, Any]]:
    flags_ = (["--enable-cpu-kernels"] if policy == "on" else []) + extra
    logging.info("starting a server on %s with %s", model_path, " ".join(flags_))
    with server_process(model_path, flags_) as (proc, url):
        vocab = _vocab(model_path)
        records = []
        for c in FLAGS.concurrency:
            logging.info("policy %s, concurrency %s", policy, c)
            rec = _level(url, int(c), FLAGS["num-prompts"].value, FLAGS["warmup-requests"].value,
                         FLAGS["input-len"].value, FLAGS["output-len"].value, vocab)
            rec.update(policy=policy, server_peak_rss_mib=peak_rss_mib(proc.pid),
                       input_len=FLAGS["input-len"].value, output_len=FLAGS["output-len"].value)
            records.append(rec)
        return records


def _vocab(model_path: str) -> int:
    from rvascend.models import gguf_checkpoint

    if gguf_checkpoint.is_gguf(model_path):
        return int(gguf_checkpoint.GgufCheckpoint(model_path).config["vocab_size"])
    with open(os.path.join(model_path, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def main(argv: list[str]) -> int:
    del argv
    from rvascend.models.random_model import ensure_random_model

    model_path = FLAGS["model-path"].value or ensure_random_model()
    records = []
    for policy in FLAGS.policy:
        records += run_server(policy, model_path, FLAGS["server-args"].value.split())
    print_table(records, [("policy", "policy", "s"), ("max_concurrency", "conc", "d"),
                          ("request_throughput", "req/s", ".2f"), ("output_throughput", "out tok/s", ".2f"),
                          ("total_throughput", "total tok/s", ".1f"), ("median_ttft_ms", "TTFT ms", ".1f"),
                          ("p99_ttft_ms", "P99 TTFT", ".1f"), ("median_itl_ms", "ITL ms", ".1f"),
                          ("p99_itl_ms", "P99 ITL", ".1f"), ("median_e2e_latency_ms", "E2E ms", ".1f"),
                          ("mean_decode_tok_per_s_per_request", "dec tok/s/req", ".2f"),
                          ("benchmark_duration", "wall s", ".2f"), ("server_peak_rss_mib", "RSS MiB", ".0f")])
    manifest = None
    try:
        from rvascend.repro import manifest as repro
        manifest = repro.capture(checkpoint_dir=model_path)
    except ImportError:
        pass
    write_jsonl(FLAGS.output, records, manifest)
    if FLAGS.plot:
        bar_plot(FLAGS.plot, "serving: output tokens/s", [f"{r['policy']} c={r['max_concurrency']}" for r in records],
                 {"output tok/s": [r["output_throughput"] for r in records]}, "tokens / s")
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

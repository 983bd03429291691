"""Several servers behind sglang-router on this machine: aggregate decode throughput
with 1, 2 and 4 workers (one thread each) at a fixed concurrency, and the router's
added latency per request.

For each worker count, `scale_out.Cluster` starts the workers (OMP_NUM_THREADS=1)
and the router; warm-up requests, then `--num-prompts` requests of `--input-len`
random words and exactly `--output-len` generated tokens, `--concurrency`
at a time, through the router. Aggregate decode throughput is generated tokens
over the wall time of the measured requests; the scaling factor is its ratio to
one worker's. The router's overhead: with one worker, `--latency-pairs` one-token
requests sent back to back to the worker directly and through the router,
interleaved in one run; P50 and P99 of each and of the per-pair difference.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import tempfile
import time
from typing import Any

import httpx
from absl import app, flags, logging

from rvascend.bench.results import percentile, print_table, write_jsonl
from rvascend.models import random_checkpoint
from rvascend.repro import manifest
from rvascend.server import scale_out

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("workers", ["1", "2", "4"], "Worker counts to measure.")
    flags.DEFINE_enum("shape", "smollm2-135m", random_checkpoint.CHOICES, "Random-weight model the workers serve.")
    flags.DEFINE_integer("concurrency", 8, "Requests in flight through the router.")
    flags.DEFINE_integer("num-prompts", 32, "Measured requests per worker count.")
    flags.DEFINE_integer("input-len", 32, "Prompt words.")
    flags.DEFINE_integer("output-len", 32, "Generated tokens (EOS ignored).")
    flags.DEFINE_integer("latency-pairs", 50, "Direct/routed one-token request pairs for the router's overhead.")
    flags.DEFINE_string("output", "bench_results/scale_out.jsonl", "jsonl file to append to.")


API_KEY = "bench"


def _complete(client: httpx.Client, url: str, model: str, prompt: str, output_len: int) -> int:
    r = client.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": output_len,
                                                   "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def _throughput(cluster: scale_out.Cluster, client: httpx.Client, model: str) -> dict[str, Any]:
    # Text prompts (the router's OpenAI routes take text): random words, about input-len tokens.
    rng = random.Random(len(cluster.urls))
    words = ["river", "stone", "cloud", "garden", "signal", "copper", "window", "harbor", "lantern", "meadow"]
    prompts = [" ".join(rng.choice(words) for _ in range(FLAGS["input-len"].value))
               for _ in range(FLAGS["num-prompts"].value + FLAGS.concurrency)]
    with concurrent.futures.ThreadPoolExecutor(FLAGS.concurrency) as pool:
        list(pool.map(lambda p: _complete(client, cluster.url, model, p, 4), prompts[:FLAGS.concurrency]))  # warm-up
        start = time.perf_counter()
        tokens = sum(pool.map(lambda p: _complete(client, cluster.url, model, p, FLAGS["output-len"].value),
                              prompts[FLAGS.concurrency:]))
        wall = time.perf_counter() - start
    return {"generated_tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall}


def _router_overhead(cluster: scale_out.Cluster, client: httpx.Client, model: str) -> dict[str, Any]:
    direct, routed = [], []
    for i in range(FLAGS["latency-pairs"].value):
        for url, out in ((cluster.urls[0], direct), (cluster.url, routed)):
            start = time.perf_counter()
            _complete(client, url, model, f"request {i}", 1)
            out.append(1000 * (time.perf_counter() - start))
    diff = [r - d for d, r in zip(direct, routed)]
    return {f"{name}_ms_{q}": percentile(values, q) for name, values in
            (("direct", direct), ("routed", routed), ("added", diff)) for q in (50, 99)}


def main(argv: list[str]) -> int:
    del argv
    os.environ["OMP_NUM_THREADS"] = "1"  # one thread per worker (inherited by the worker processes)
    model_path = random_checkpoint.ensure(FLAGS.shape)
    args = [f"--model-path={model_path}", f"--api-key={API_KEY}"]
    client = httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600)
    rows = []
    for n in (int(w) for w in FLAGS.workers):
        logging.info("%d worker(s) of %s behind the router", n, FLAGS.shape)
        cluster = scale_out.Cluster(n, args, api_key=API_KEY, log_dir=tempfile.mkdtemp(prefix="scale_out_bench_"))
        try:
            model = client.get(cluster.urls[0] + "/v1/models").json()["data"][0]["id"]
            row = {"bench": "scale_out", "shape": FLAGS.shape, "workers": n, "concurrency": FLAGS.concurrency,
                   "input_len": FLAGS["input-len"].value, "output_len": FLAGS["output-len"].value,
                   **_throughput(cluster, client, model)}
            if n == 1:
                row.update(_router_overhead(cluster, client, model))
            rows.append(row)
        finally:
            cluster.stop()
    base = rows[0]["aggregate_tok_s"] / rows[0]["workers"] if rows else 1.0
    for row in rows:
        row["scaling_vs_one_worker"] = row["aggregate_tok_s"] / base
    print_table(rows, [("workers", "workers", "d"), ("aggregate_tok_s", "tok/s", ".1f"),
                       ("scaling_vs_one_worker", "scaling", ".2f"), ("direct_ms_50", "direct P50 ms", ".1f"),
                       ("routed_ms_50", "routed P50 ms", ".1f"), ("added_ms_50", "added P50 ms", ".1f"),
                       ("added_ms_99", "added P99 ms", ".1f")])
    write_jsonl(FLAGS.output, rows, manifest.capture(checkpoint_dir=model_path))
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main)

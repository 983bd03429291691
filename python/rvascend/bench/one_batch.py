"""One-batch latency benchmark (SGLang's bench_one_batch settings and jsonl keys).

Batch 1, input 64, output 8 by default: prefill latency/throughput, median
decode latency/throughput, total latency/throughput, peak RSS. Runs this
engine with the RVV policy off and on (`--policy`), and optionally Hugging
Face transformers' `generate` on the same checkpoint and thread count.

Every decode step is timed by itself (engine steps; a logits processor's time
stamps inside `generate`). After the warm-up runs, `--repeats` timed runs: the
prefill figures are the median run's, the decode figures the median step of all
runs (a single prefill moved by 30 % between runs on a shared host).
`--interleave` loads every policy's model into one process and runs them in
turn, so the host's drift over minutes meets each alike. The weight read rate
of a decode step (bytes of every weight the step reads / median step time) is
reported as a fraction of the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any, Optional

import torch
from absl import app, flags, logging

from rvascend.bench.plots import bar_plot
from rvascend.bench.results import print_table, write_jsonl
from rvascend.testing.rss import peak_rss_mib, reset_peak_rss
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.bench.timing import copy_bandwidth
from rvascend.models import random_checkpoint
from rvascend.runtime import allocator
from rvascend.models.loader import load_model
from rvascend.models.quantized_layers import QuantizedLinear
from rvascend.policy import KernelPolicyConfig, install_kernel_policy
from rvascend.dispatch.route import PACKED_BUFFER

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("model-path", None, "Checkpoint directory (default: --shape).")
    flags.DEFINE_enum("shape", "test", random_checkpoint.CHOICES,
                      "Without --model-path: the random-weight test model, or a random checkpoint of a real "
                      "model's shape.")
    flags.DEFINE_integer("batch-size", 1, "Sequences in the batch.")
    flags.DEFINE_integer("input-len", 64, "Prompt tokens per sequence.")
    flags.DEFINE_integer("output-len", 8, "Generated tokens per sequence.")
    flags.DEFINE_list("policy", ["off", "on"], "Runs: RVV policy off, on, and/or drop (on, with the packed copies as "
                      "the weights and eager routes: --cpu-kernels-drop-unpacked --cpu-compile-mode eager).")
    flags.DEFINE_enum("cpu-compile-mode", "regional", ["regional", "eager"], "Policy compile mode.")
    flags.DEFINE_bool("hf", False, "Also time transformers' generate on the same checkpoint.")
    flags.DEFINE_integer("threads", None, "torch threads (default: torch's).")
    flags.DEFINE_integer("warmup", 1, "Untimed runs first (compiles the buckets).")
    flags.DEFINE_integer("repeats", 3, "Timed runs after the warm-up: median prefill, median decode step of all.",
                         lower_bound=1)
    flags.DEFINE_bool("interleave", False,
                      "Load every --policy run's model into this process and run them in turn, run by run, so a "
                      "shared host's drift meets each alike (no peak RSS then: the models share the process).")
    flags.DEFINE_string("output", "bench_results/one_batch.jsonl", "jsonl file to append to.")
    flags.DEFINE_string("plot", "bench_results/one_batch.png", "PNG plot (empty: none).")


POLICY_MODES = ("off", "on", "drop")


class _Runs:
    """One engine over a model, and its timed runs: each run a fresh batch of random prompts."""

    def __init__(self, model, batch: int, input_len: int, output_len: int) -> None:
        self.engine = Engine(model, None, EngineConfig(max_total_tokens=batch * (input_len + output_len) + 16,
                                                       max_running_requests=batch,
                                                       max_prefill_tokens=batch * input_len))
        self.params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
        self.batch, self.input_len, self.output_len = batch, input_len, output_len
        self.vocab = model.config.vocab_size
        self.generator = torch.Generator().manual_seed(0)
        self.timed: list[list[float]] = []

    def run(self, timed: bool) -> None:
        for _ in range(self.batch):
            prompt = torch.randint(0, self.vocab, (self.input_len,), generator=self.generator).tolist()
            self.engine.add_request(prompt, self.params)
        steps = []
        while self.engine.has_work():
            t0 = time.perf_counter()
            self.engine.step()
            steps.append(time.perf_counter() - t0)
        if timed:
            self.timed.append(steps)


def run_in_turn(runs: dict[str, _Runs], warmup: int, repeats: int) -> None:
    """`warmup` untimed then `repeats` timed runs of each policy's engine, the engines in
    turn run by run."""
    for attempt in range(warmup + repeats):
        logging.info("run %d of %d: policy %s%s", attempt + 1, warmup + repeats, ", ".join(runs),
                     " in turn" if len(runs) > 1 else "")
        for r in runs.values():
            r.run(timed=attempt >= warmup)


def summarize_runs(runs: list[list[float]], batch: int, input_len: int, output_len: int) -> dict[str, Any]:
    """The figures of timed runs, each a list of step times (the prefill first): the
    median prefill and total, the median decode step over every run."""
    prefill = statistics.median(r[0] for r in runs)
    decode = [t for r in runs for t in r[1:]]
    total = statistics.median(sum(r) for r in runs)
    median_decode = statistics.median(decode) if decode else float("nan")
    return {"prefill_latency": prefill, "prefill_throughput": batch * input_len / prefill,
            "median_decode_latency": median_decode, "median_decode_throughput": batch / median_decode,
            "total_latency": total, "overall_throughput": batch * (input_len + output_len) / total,
            "timed_runs": len(runs)}


def run_hf(path: str, batch: int, input_len: int, output_len: int, warmup: int,
           bandwidth: float) -> dict[str, Any]:
    """transformers' generate, every step timed by itself: a logits processor stamps the
    time after each forward pass, so the first interval is the prefill and each later one
    a decode step (no decode time derived by subtracting a separately timed prefill)."""
    import transformers

    class StepClock(transformers.LogitsProcessor):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            return scores

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    for _ in range(warmup + 1):
        ids = torch.randint(0, vocab, (batch, input_len), generator=g)
        clock = StepClock()
        with torch.no_grad():
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                           logits_processor=transformers.LogitsProcessorList([clock]))
            total = time.perf_counter() - t0
    steps = [b - a for a, b in zip([t0] + clock.stamps, clock.stamps)]
    prefill, decode = steps[0], steps[1:]
    median_decode = statistics.median(decode) if decode else float("nan")
    result = {"prefill_latency": prefill, "prefill_throughput": batch * input_len / prefill,
              "median_decode_latency": median_decode, "median_decode_throughput": batch / median_decode,
              "total_latency": total, "overall_throughput": batch * (input_len + output_len) / total}
    return {**result, **_weight_rate(weight_bytes_per_step(model), result, bandwidth),
            "note": "each decode step timed between two forward passes (a logits processor's time stamps)"}


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode step reads: every matrix of the decoder
    layers and lm_head's (the embedding lookup reads a row per token)."""
    def matrices(module: torch.nn.Module) -> int:
        # A quantized projection's weight is its uint8 buffers (models/quantized_layers.py).
        quantized = sum(b.numel() for n, b in module.named_buffers() if n.rpartition(".")[2].startswith("qweight"))
        # With --cpu-kernels-drop-unpacked a packed buffer is the weight (padded rows included).
        owned = sum(b.numel() * b.element_size() for m in module.modules() if "weight" not in m._parameters
                    for n, b in m._buffers.items() if n == PACKED_BUFFER)
        return quantized + owned + sum(p.numel() * p.element_size() for p in module.parameters() if p.dim() == 2)

    head = model.lm_head
    return matrices(model.model.layers) + (matrices(head) if isinstance(head, QuantizedLinear) or
                                           "weight" not in head._parameters else
                                           head.weight.numel() * head.weight.element_size())


def main(argv: list[str]) -> int:
    del argv
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    path = FLAGS["model-path"].value or random_checkpoint.ensure(FLAGS.shape)
    from rvascend import ops

    bandwidth = copy_bandwidth()
    logging.info("host: %s; copy bandwidth %.1f GB/s", ops.cpu_features(), bandwidth / 1e9)
    batch, input_len, output_len = FLAGS["batch-size"].value, FLAGS["input-len"].value, FLAGS["output-len"].value
    base = {"batch_size": batch, "input_len": input_len, "output_len": output_len, "model_path": path,
            "threads": torch.get_num_threads(), "dtype": "bfloat16", "copy_gbps": bandwidth / 1e9}
    records = []
    loaded = []  # (mode, model, runs): the --interleave runs, run in turn once all are loaded
    for mode in FLAGS.policy:
        if mode not in POLICY_MODES:
            raise ValueError(f"--policy {mode!r}: each run is one of {', '.join(POLICY_MODES)}")
        # Each run's peak RSS is its own: not the bandwidth probe's 2 GiB, not the previous run's model.
        gc.collect()
        allocator.pin_mmap_threshold()  # as the server does (server/launch.py); returns what the heap kept
        reset_peak_rss()
        model = _load(path, mode)
        allocator.keep_step_buffers()  # the weights are in place, as the server's
        runs = _Runs(model, batch, input_len, output_len)
        if FLAGS.interleave:
            loaded.append((mode, model, runs))
            continue
        run_in_turn({mode: runs}, FLAGS.warmup, FLAGS.repeats)
        records.append({**_policy_record(base, mode, model, runs, bandwidth), "peak_rss_mib": peak_rss_mib()})
        del model, runs
    if loaded:
        run_in_turn({mode: runs for mode, _, runs in loaded}, FLAGS.warmup, FLAGS.repeats)
        # No peak RSS: every model shares the process.
        records.extend({**_policy_record(base, *entry, bandwidth), "interleaved": True} for entry in loaded)
    del loaded
    if FLAGS.hf:
        gc.collect()
        allocator.pin_mmap_threshold()  # transformers loads its weights too: as for the runs above
        reset_peak_rss()
        records.append({**base, "run_name": "hf-generate", "backend": "transformers", "policy": "n/a",
                        **run_hf(path, batch, input_len, output_len, FLAGS.warmup, bandwidth),
                        "peak_rss_mib": peak_rss_mib()})
    print_table(records, [("run_name", "run", "s"), ("prefill_latency", "prefill s", ".4f"),
                          ("prefill_throughput", "prefill tok/s", ".1f"),
                          ("median_decode_latency", "decode s", ".4f"),
                          ("median_decode_throughput", "decode tok/s", ".2f"),
                          ("total_latency", "total s", ".3f"), ("overall_throughput", "total tok/s", ".1f"),
                          ("weight_gbps", "weights GB/s", ".1f"), ("bandwidth_fraction", "of copy BW", ".2f"),
                          ("peak_rss_mib", "peak RSS MiB", ".0f")])
    rate = {r["run_name"]: r["median_decode_throughput"] for r in records}
    on = rate.get("rvascend-policy-on")
    for other in ("rvascend-policy-off", "hf-generate"):
        if on and other in rate:
            logging.info("decode tok/s, policy on / %s: %.2f", other, on / rate[other])
    write_jsonl(FLAGS.output, records, _manifest(path))
    if FLAGS.plot:
        bar_plot(FLAGS.plot, f"one batch: bs {batch}, in {input_len}, out {output_len}",
                 [r["run_name"] for r in records],
                 {"decode tok/s": [r["median_decode_throughput"] for r in records]}, "tokens / s")
    logging.info("wrote %s", FLAGS.output)
    return 0


def _policy_record(base: dict[str, Any], mode: str, model, runs: _Runs, bandwidth: float) -> dict[str, Any]:
    result = summarize_runs(runs.timed, runs.batch, runs.input_len, runs.output_len)
    return {**base, "run_name": f"rvascend-policy-{mode}", "backend": "rvascend", "policy": mode, **result,
            **_weight_rate(weight_bytes_per_step(model), result, bandwidth)}


def _load(path: str, mode: str) -> torch.nn.Module:
    # As the server loads it (server/launch.py): with the policy, a GGUF file's
    # quantized projections stay quantized.
    model = load_model(path, keep_quantized=mode != "off")
    if mode != "off":
        # "drop" is the smallest footprint: the packed copies are the weights, and nothing
        # compiles (torch._dynamo and Inductor alone are about 70 MiB of RSS).
        install_kernel_policy(model, KernelPolicyConfig.from_flag(
            compile_mode="eager" if mode == "drop" else FLAGS["cpu-compile-mode"].value,
            drop_unpacked=mode == "drop"))
    return model


def _weight_rate(step_bytes: int, result: dict[str, Any], bandwidth: float) -> dict[str, float]:
    rate = step_bytes / result["median_decode_latency"]
    return {"weight_bytes_per_step": step_bytes, "weight_gbps": rate / 1e9, "bandwidth_fraction": rate / bandwidth}


def _manifest(model_path: str) -> Optional[dict[str, Any]]:
    try:
        from rvascend.repro import manifest
    except ImportError:
        return None
    return manifest.capture(checkpoint_dir=model_path)


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

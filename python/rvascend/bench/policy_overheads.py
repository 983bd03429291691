"""What the RVV policy costs besides its kernels: start-up with the compile cache
cold and warm, the graphs regional compile keeps after serving, and the
per-call price of the staleness check.

Start-up runs in child processes, each with the same fresh Inductor cache
directory: the first finds it empty (cold), the second finds the first's
artifacts (warm); eager mode (nothing to compile) is the baseline. Each child
loads the checkpoint, installs the policy, answers one request (64 tokens in,
8 out: the first-request latency) and then serves batches of 1..8 concurrent
requests of mixed lengths, after which it reports how many graphs regional
compile compiled.

The staleness check is timed in this process: one projection route's check
(identity, pointer, strides, version, 128-sample content fingerprint) and the
fused decode step's per-step check of every packed weight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.bench.timing import time_calls
from rvascend.models import random_checkpoint

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_enum("shape", "qwen3-0.6b", random_checkpoint.CHOICES,
                      "Random-weight checkpoint: the test model or a real model's shape.")
    flags.DEFINE_integer("threads", None, "torch threads (default: torch's).")
    flags.DEFINE_integer("max-concurrency", 8, "Serve batches of 1..N concurrent requests after the first one.")
    flags.DEFINE_string("output", "bench_results/policy_overheads.jsonl", "jsonl file to append to.")
    flags.DEFINE_string("child", None, "(internal) run one start-up measurement in this mode and print it.")


def child(mode: str) -> dict[str, Any]:
    """Load, install, first request, then concurrent batches; seconds and graph count."""
    from rvascend.engine import Engine, EngineConfig, SamplingParams
    from rvascend.models.loader import load_model
    from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy

    t0 = time.perf_counter()
    model = load_model(random_checkpoint.ensure(FLAGS.shape))
    report = install_kernel_policy(model, KernelPolicyConfig.from_flag(compile_mode=mode))
    engine = Engine(model, None, EngineConfig(max_total_tokens=4096, max_running_requests=FLAGS["max-concurrency"].value))
    loaded = time.perf_counter()
    vocab = model.config.vocab_size
    engine.generate([[(7 * i) % vocab for i in range(64)]], SamplingParams(max_tokens=8, temperature=0,
                                                                         ignore_eos=True))
    first = time.perf_counter()
    for concurrency in range(1, FLAGS["max-concurrency"].value + 1):
        prompts = [[(13 * i + 5 * c + concurrency) % vocab for i in range(9 + 11 * c)] for c in range(concurrency)]
        engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    served = time.perf_counter()
    policy = get_policy(model)
    graphs = policy.regional.graphs if policy.regional is not None else []
    return {"mode": mode, "compile_mode": report.compile_mode, "load_install_s": loaded - t0,
            "first_request_s": first - loaded, "serving_s": served - first, "graphs": len(graphs),
            "graph_inputs": [list(map(list, shapes[:1])) + [name] for name, shapes in graphs]}


def staleness_check_costs(path: str) -> dict[str, float]:
    from rvascend.models.decoder import KVPool
    from rvascend.models.loader import load_model
    from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy
    from rvascend.dispatch import fused_decoder

    model = load_model(path)
    install_kernel_policy(model, KernelPolicyConfig.from_flag(compile_mode="eager"))
    policy = get_policy(model)
    route = next(r for r in policy.routes.values() if r.projection == "qkv_proj")
    weight = route._module().weight
    fused = fused_decoder.fused_decoder_of(model)
    pool = KVPool(model.config, 8, torch.bfloat16)
    plan, why = fused_decoder._Plan.build(fused, pool)
    if plan is None:
        raise RuntimeError(f"the fused step's plan could not be built: {why}")
    route_s, plan_s = time_calls([lambda: route.packed_weight(weight), lambda: plan.holds(pool)], min_seconds=0.5)
    return {"route_check_us": route_s * 1e6, "step_check_us": plan_s * 1e6, "weights_checked": len(plan.weights)}


def main(argv: list[str]) -> int:
    del argv
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    if FLAGS.child:
        print(json.dumps(child(FLAGS.child)))
        return 0
    path = random_checkpoint.ensure(FLAGS.shape)
    records = []
    with tempfile.TemporaryDirectory(prefix="rvascend-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        for mode, state in (("eager", "n/a"), ("regional", "cold"), ("regional", "warm")):
            logging.info("start-up: %s, compile cache %s", mode, state)
            args = [sys.executable, "-m", "rvascend.bench.policy_overheads", f"--child={mode}", f"--shape={FLAGS.shape}",
                    f"--max-concurrency={FLAGS['max-concurrency'].value}"]
            if FLAGS.threads:
                args.append(f"--threads={FLAGS.threads}")
            out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
            records.append({"model_path": path, "cache": state, **json.loads(out.strip().splitlines()[-1])})
    print_table(records, [("mode", "mode", "s"), ("cache", "compile cache", "s"),
                          ("load_install_s", "load+install s", ".2f"), ("first_request_s", "first request s", ".2f"),
                          ("serving_s", "batches 1..N s", ".2f"), ("graphs", "graphs", "d")])
    costs = staleness_check_costs(path)
    logging.info("staleness check: %.1f us per projection call; %.0f us per fused decode step (%d weights)",
                 costs["route_check_us"], costs["step_check_us"], costs["weights_checked"])
    records.append({"model_path": path, "mode": "staleness_check", **costs})
    write_jsonl(FLAGS.output, records)
    logging.info("wrote %s", FLAGS.output)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

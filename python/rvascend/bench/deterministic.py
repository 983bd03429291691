"""What deterministic inference costs (`./dev bench --parts=deterministic`).

Four ways to serve one model, timed side by side in one process, alternating
--rounds times, each with the weights as `./dev serve` loads them under its flags:
`off` (--noenable-deterministic-inference: no policy, ATen, a GGUF file's weights
dequantized), `kernels` (--enable-cpu-kernels alone: the measured shape gate,
regional compile off here, GGUF weights kept quantized), `deterministic`
(--enable-deterministic-inference: the invariant gate on the dequantized weights;
what `./dev serve` runs by default where it costs nothing, server/launch.py) and
`deterministic_quantized` (both flags: the invariant gate and the quantized kernels).
Every engine step is timed by itself: the median decode step at batch 1 and 8, and
a --prefill-len prompt prefilled whole (one step). Reported: each step's time and
its ratio to `kernels` and to `off`. With --dtype float32 two modes: `off` (ATen's
FP32 GEMMs and SDPA) and `deterministic` (the FP32 Linear and attention kernels).
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
from rvascend.models.random_model import ensure_random_model
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy

FLAGS = flags.FLAGS
MODES = {"bfloat16": ("off", "kernels", "deterministic", "deterministic_quantized"),
         "float32": ("off", "deterministic")}


def _define_flags() -> None:
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the random-weight test model).")
    flags.DEFINE_enum("dtype", "bfloat16", sorted(MODES), "The model's dtype, as ./dev serve's --dtype.")
    flags.DEFINE_list("batch", ["1", "8"], "Decoding sequences.")
    flags.DEFINE_integer("steps", 24, "Decode steps timed per run.")
    flags.DEFINE_integer("prefill-len", 256, "Prompt tokens of the prefill step.")
    flags.DEFINE_integer("rounds", 3, "Runs of each mode, alternated.")
    flags.DEFINE_string("output", "bench_results/deterministic.jsonl", "jsonl file to append to.")


def _model(path: str, mode: str, dtype: str):
    model = load_model(path, getattr(torch, dtype), keep_quantized=mode in ("kernels", "deterministic_quantized"))
    if mode != "off":
        install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=mode.startswith("deterministic")))
    return model


def _decode(model, batch: int, steps: int) -> float:
    engine = Engine(model, None, EngineConfig(max_total_tokens=batch * (64 + steps) + 64, max_running_requests=batch))
    seqs = [engine.add_request(list(range(5 + i, 37 + i)), SamplingParams(max_tokens=steps + 1, temperature=0,
                                                                        ignore_eos=True)) for i in range(batch)]
    return statistics.median(engine_model.decode_step_seconds(engine, seqs))


def _prefill(model, length: int) -> float:
    engine = Engine(model, None, EngineConfig(max_total_tokens=length + 64, chunked_prefill_size=length,
                                              disable_radix_cache=True))
    vocab = model.config.vocab_size
    engine.add_request([(7 * i + 3) % vocab for i in range(length)],
                       SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    t0 = time.perf_counter()
    engine.step()
    seconds = time.perf_counter() - t0
    while engine.has_work():
        engine.step()
    return seconds


def main(argv: list[str]) -> int:
    del argv
    path = FLAGS["model-path"].value or ensure_random_model()
    dtype = FLAGS.dtype
    modes = MODES[dtype]
    base = "kernels" if "kernels" in modes else "off"
    models = {mode: _model(path, mode, dtype) for mode in modes}
    tests = [(f"decode B={b}", lambda m, b=int(b): _decode(m, b, FLAGS.steps)) for b in FLAGS.batch]
    tests.append((f"prefill {FLAGS['prefill-len'].value}", lambda m: _prefill(m, FLAGS["prefill-len"].value)))
    for _, run in tests:  # warm-up: first calls, packing checks, allocator
        for model in models.values():
            run(model)
    times = {(name, mode): [] for name, _ in tests for mode in modes}
    for _ in range(FLAGS.rounds):
        for name, run in tests:
            for mode, model in models.items():
                times[(name, mode)].append(run(model))
    records = []
    for name, _ in tests:
        median = {mode: statistics.median(times[(name, mode)]) for mode in modes}
        for mode in modes:
            records.append({"model_path": path, "dtype": dtype, "threads": torch.get_num_threads(), "step": name,
                            "mode": mode, "ms": 1e3 * median[mode], "vs_kernels": median[mode] / median[base],
                            "vs_off": median[mode] / median["off"]})
        logging.info("%s: %s", name, ", ".join(f"{m} {1e3 * median[m]:.2f} ms" for m in modes))
    columns = [("step", "step", "s"), ("mode", "mode", "s"), ("ms", "ms", ".2f")]
    if base != "off":
        columns.append(("vs_kernels", f"vs {base}", ".3f"))
    print_table(records, columns + [("vs_off", "vs off", ".3f")])
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

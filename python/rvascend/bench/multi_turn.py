"""A multi-turn chat on a hybrid model, and a restart: what the prefix cache and its tiers save.

One conversation of `--turns` turns: turn 1 is a `--system-len`-token system prompt and a
`--turn-len`-token user message; each later turn resends the whole conversation (the
previous prompt, the answer, a new message), as every chat client does. Time to first
token per turn (the engine's own timestamps: arrival to first token) with the prefix
cache on and off, side by side in one process; then a restart: turn 1 on an engine with
the hierarchical cache's file tier, the engine closed, a new engine on the same directory
(empty pool, empty host memory) answering turn 1 again, against turn 1 cold.

`--shape=qwen3-0.6b` is the dense model of the same width; `--model-path=default` SmolLM2
with its real weights.

Targets (issue 61): turns 2.. at most 1/4 of turn 1 with the cache; the restarted turn at
most 1/4 of the cold one. Defaults: Qwen3.5-0.8B's shapes with random weights (speed
only: the answers are not read), BF16 under deterministic inference (the kernels' routes).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from typing import Any

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models import random_checkpoint
from rvascend.models.default_model import ensure_default_model
from rvascend.models.loader import load_model

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("model-path", None, "Checkpoint or GGUF file; 'default': the default model (SmolLM2-135M-"
                        "Instruct, real weights); unset: --shape with random weights.")
    flags.DEFINE_enum("shape", "qwen3.5-0.8b", random_checkpoint.CHOICES, "Shapes of the random-weight model.")
    flags.DEFINE_integer("threads", None, "torch threads (default: torch's).")
    flags.DEFINE_integer("turns", 4, "Turns of the conversation.")
    flags.DEFINE_integer("system-len", 2500, "Tokens of the system prompt.")
    flags.DEFINE_integer("turn-len", 20, "Tokens of each user message.")
    flags.DEFINE_integer("output-len", 24, "Tokens of each answer.")
    flags.DEFINE_string("output", "bench_results/multi_turn.jsonl", "jsonl file to append to.")


def _model():
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    path = FLAGS["model-path"].value or random_checkpoint.ensure(FLAGS.shape)
    if path == "default":
        path = ensure_default_model()
    model = load_model(path, torch.bfloat16)
    from rvascend.policy import KernelPolicyConfig, install_kernel_policy

    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    return path, model


def _engine(model, longest: int, **config: Any) -> Engine:
    return Engine(model, None, EngineConfig(max_total_tokens=longest + 64, max_running_requests=1, **config))


def _turn(engine: Engine, prompt: list[int], output_len: int):
    (seq,) = engine.generate([prompt], SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True))
    if seq.error:
        raise RuntimeError(seq.error)
    return seq


def conversation(model, messages: list[list[int]], output_len: int, cache: bool) -> list[dict[str, Any]]:
    longest = sum(map(len, messages)) + len(messages) * output_len
    engine = _engine(model, longest, disable_radix_cache=not cache)
    prompt: list[int] = []
    rows = []
    for turn, message in enumerate(messages, 1):
        prompt = prompt + message
        seq = _turn(engine, prompt, output_len)
        rows.append({"setting": "cache on" if cache else "cache off", "turn": turn, "prompt_len": len(prompt),
                     "cached_tokens": seq.cached_tokens, "ttft_s": seq.first_token_time - seq.arrival})
        prompt = prompt + seq.output_ids
    return rows


def restart(model, prompt: list[int], output_len: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as directory:
        tiers = dict(enable_hierarchical_cache=True, hicache_storage_backend="file", hicache_storage_dir=directory,
                     hicache_size=4.0, hicache_storage_size=8.0)
        rows = []
        for setting in ("cold (tiers empty)", "restarted (from files)"):
            engine = _engine(model, len(prompt) + output_len, **tiers)
            seq = _turn(engine, prompt, output_len)
            engine.close()  # the writes land, as at a server's shutdown
            stats = engine.stats()
            rows.append({"setting": setting, "turn": 1, "prompt_len": len(prompt), "cached_tokens": seq.cached_tokens,
                         "ttft_s": seq.first_token_time - seq.arrival,
                         "disk_bytes": stats["hicache_disk_bytes"], "loaded_tokens": stats["hicache_loaded_tokens"]})
        return rows


def main(argv: list[str]) -> int:
    del argv
    path, model = _model()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    messages = [torch.randint(0, vocab, (FLAGS["system-len"].value + FLAGS["turn-len"].value,), generator=g).tolist()]
    messages += [torch.randint(0, vocab, (FLAGS["turn-len"].value,), generator=g).tolist()
                 for _ in range(FLAGS.turns - 1)]
    output_len = FLAGS["output-len"].value
    logging.info("warm-up (first-call work)")
    conversation(model, [messages[0][:64]], 2, True)
    rows = conversation(model, messages, output_len, False) + conversation(model, messages, output_len, True)
    rows += restart(model, messages[0], output_len)
    print_table(rows, [("setting", "setting", "s"), ("turn", "turn", "d"), ("prompt_len", "prompt", "d"),
                       ("cached_tokens", "cached", "d"), ("ttft_s", "TTFT s", ".3f")])
    on = {r["turn"]: r["ttft_s"] for r in rows if r["setting"] == "cache on"}
    off = {r["turn"]: r["ttft_s"] for r in rows if r["setting"] == "cache off"}
    later = [on[t] / on[1] for t in on if t > 1]
    cold, warm = (r["ttft_s"] for r in rows[-2:])
    summary = {"model_path": path, "threads": torch.get_num_threads(), "architecture": model.config.architecture,
               "later_turns_over_turn1_on": statistics.fmean(later) if later else None,
               "later_turns_over_turn1_off": statistics.fmean(off[t] / off[1] for t in off if t > 1) if later else None,
               "last_turn_off_over_on": off[max(off)] / on[max(on)], "restart_over_cold": warm / cold}
    print(f"turns 2..{FLAGS.turns} / turn 1, cache on: {summary['later_turns_over_turn1_on']:.3f} (target <= 0.25); "
          f"off: {summary['later_turns_over_turn1_off']:.3f}")
    print(f"last turn TTFT off / on: {summary['last_turn_off_over_on']:.1f}x")
    print(f"restarted turn 1 / cold turn 1: {summary['restart_over_cold']:.3f} (target <= 0.25)")
    write_jsonl(FLAGS.output, [{**r, **summary} for r in rows])
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

"""What a grammar costs a decode step (`./dev bench --parts=structured_output`).

B sequences decode together with the same prompt, unconstrained and then each held to
a grammar (a JSON schema that never ends, so every step is a mask: an array of
numbers; and a regex over letters), alternating --rounds times; every engine step is
timed by itself. Reported per grammar: the median decode step, its ratio to the
unconstrained one, and the mask computation alone (llguidance, on its own thread;
the step hides it behind the model's forward when the forward takes longer).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from absl import app, flags, logging

from rvascend.bench import engine_model
from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, Grammar, SamplingParams
from rvascend.tokenizer.tokenizer import Tokenizer

FLAGS = flags.FLAGS
GRAMMARS = {
    "none": None,
    "json_schema": Grammar.json_schema({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}}),
    "regex": Grammar("regex", "[a-z ]+"),
}


def _define_flags() -> None:
    engine_model.define_flags(policy="off")
    flags.DEFINE_list("batch", ["1", "8"], "Sequences decoding together.")
    flags.DEFINE_integer("steps", 48, "Decode steps timed per run.")
    flags.DEFINE_integer("rounds", 3, "Runs of each grammar, alternated.")
    flags.DEFINE_string("output", "bench_results/structured_output.jsonl", "jsonl file to append to.")


def decode_steps(engine: Engine, prompt: list[int], batch: int, grammar, steps: int) -> list[float]:
    params = SamplingParams(max_tokens=steps + 1, temperature=0.8, seed=0, ignore_eos=True, grammar=grammar)
    seqs = [engine.add_request(prompt, params) for _ in range(batch)]
    times = engine_model.decode_step_seconds(engine, seqs)
    failed = [s.error for s in seqs if s.finish_reason != "length"]
    if failed:
        raise RuntimeError(f"a sequence ended early: {failed[0]}")
    return times


def mask_seconds(engine: Engine, grammar: Grammar, batch: int, repeats: int = 20) -> float:
    """One step's masks for `batch` fresh matchers, computed as the engine computes them."""
    matchers = [engine.compile_grammar(grammar) for _ in range(batch)]
    engine._grammars.masks_later([(m, []) for m in matchers]).result()
    t0 = time.perf_counter()
    for _ in range(repeats):
        engine._grammars.masks_later([(m, []) for m in matchers]).result()
    return (time.perf_counter() - t0) / repeats


def main(argv: list[str]) -> int:
    del argv
    path, model = engine_model.load()
    tokenizer = Tokenizer(path)
    prompt = tokenizer.encode("List some numbers and words.")
    records = []
    for batch in (int(b) for b in FLAGS.batch):
        engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=batch * (len(prompt) + FLAGS.steps + 8)
                                                        + 64, max_running_requests=batch))
        times: dict[str, list[float]] = {name: [] for name in GRAMMARS}
        for _ in range(FLAGS.rounds):
            for name, grammar in GRAMMARS.items():
                times[name] += decode_steps(engine, prompt, batch, grammar, FLAGS.steps)
        base = statistics.median(times["none"])
        for name, grammar in GRAMMARS.items():
            step = statistics.median(times[name])
            records.append({"model_path": path, "vocab": model.config.vocab_size, "batch": batch,
                            "threads": torch.get_num_threads(), "grammar": name, "step_ms": 1e3 * step,
                            "step_ratio": step / base,
                            "mask_ms": 1e3 * mask_seconds(engine, grammar, batch) if grammar else 0.0})
            logging.info("batch %d, %s: %.2f ms per step", batch, name, 1e3 * step)
    print_table(records, [("batch", "B", "d"), ("grammar", "grammar", "s"), ("step_ms", "ms/step", ".2f"),
                          ("step_ratio", "vs none", ".3f"), ("mask_ms", "masks alone (ms)", ".2f")])
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

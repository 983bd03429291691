"""What n-gram speculative decoding gives (`./dev bench --parts=speculative`).

One engine with --speculative-algorithm NGRAM and one without, on the same model,
timed side by side, alternating --rounds times. Two tasks at batch 1 and --batch:
`repeat`, a prompt the answer copies from (the tokens of a text, then the same text
again: what an edit, a quote or a summary of the prompt does), greedy; and `free`,
sampled generation at temperature 1 from a short prompt, where drafts rarely match
(speculation must not cost it anything). Reported per task: output tokens per second
with and without drafts, their ratio, the tokens accepted per verify step and the
share of drafted tokens accepted. The outputs are checked to be identical.
"""

from __future__ import annotations

import sys
import time

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.random_model import ensure_random_model
from rvascend.models.loader import load_model
from rvascend.policy import RvvPolicyConfig, install_rvv_policy

FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the random-weight test model).")
    flags.DEFINE_integer("batch", 4, "Sequences decoding together (besides batch 1).")
    flags.DEFINE_integer("output-len", 96, "Tokens generated per sequence.")
    flags.DEFINE_integer("draft-tokens", 4, "--speculative-num-draft-tokens.")
    flags.DEFINE_integer("rounds", 2, "Runs of each engine, alternated.")
    flags.DEFINE_string("output", "bench_results/speculative.jsonl", "jsonl file to append to.")


def _tasks(vocab: int, batch: int, output_len: int) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    text = [(17 * i + 5) % (vocab - 10) + 5 for i in range(output_len)]
    return {
        "repeat": ([text + [3] + text[:8] for _ in range(batch)],
                   SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)),
        "free": ([[(31 * i + 7 * b) % (vocab - 10) + 5 for i in range(24)] for b in range(batch)],
                 SamplingParams(max_tokens=output_len, temperature=1.0, seed=11, ignore_eos=True)),
    }


def _run(model, prompts, params, spec: bool, draft_tokens: int) -> tuple[float, list, dict, int]:
    engine = Engine(model, None, EngineConfig(
        max_total_tokens=len(prompts) * (len(prompts[0]) + params.max_tokens + 32) + 64,
        max_running_requests=len(prompts), speculative_algorithm="NGRAM" if spec else None,
        speculative_num_draft_tokens=draft_tokens))
    seqs = [engine.add_request(p, params) for p in prompts]
    while any(s.prefilling or not s.output_ids for s in seqs):  # prompts and first tokens: not timed
        engine.step()
    done = sum(len(s.output_ids) for s in seqs)
    steps = 0
    t0 = time.perf_counter()
    while engine.has_work():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.output_ids) for s in seqs) - done
    return tokens / seconds, [s.output_ids for s in seqs], engine.stats(), steps


def main(argv: list[str]) -> int:
    del argv
    path = FLAGS["model-path"].value or ensure_random_model()
    model = load_model(path, torch.bfloat16, keep_quantized=True)
    install_rvv_policy(model, RvvPolicyConfig(compile_mode="eager", deterministic=True))
    records = []
    for batch in (1, FLAGS.batch):
        for task, (prompts, params) in _tasks(model.config.vocab_size, batch, FLAGS["output-len"].value).items():
            speeds = {False: [], True: []}
            outputs, stats, steps = {}, {}, {}
            for _ in range(FLAGS.rounds):
                for spec in (False, True):
                    tok_s, outputs[spec], stats[spec], steps[spec] = _run(model, prompts, params, spec,
                                                                         FLAGS["draft-tokens"].value)
                    speeds[spec].append(tok_s)
            if outputs[True] != outputs[False]:
                raise RuntimeError(f"{task}: speculative decoding changed the output")
            drafted, accepted = stats[True]["spec_drafted_tokens"], stats[True]["spec_accepted_tokens"]
            plain, spec = max(speeds[False]), max(speeds[True])
            records.append({"model_path": path, "threads": torch.get_num_threads(), "task": task, "batch": batch,
                            "tok_s": plain, "spec_tok_s": spec, "speedup": spec / plain,
                            "tokens_per_step": batch * FLAGS["output-len"].value / max(1, steps[True]) / batch,
                            "accept_rate": accepted / drafted if drafted else 0.0})
            logging.info("%s, batch %d: %.1f -> %.1f tok/s", task, batch, plain, spec)
    print_table(records, [("task", "task", "s"), ("batch", "B", "d"), ("tok_s", "tok/s", ".1f"),
                          ("spec_tok_s", "NGRAM tok/s", ".1f"), ("speedup", "speed-up", ".2f"),
                          ("tokens_per_step", "tokens/step/seq", ".2f"), ("accept_rate", "accepted", ".1%")])
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

"""What speculative decoding gives (`./dev bench --parts=speculative`).

One engine with --speculative-algorithm NGRAM (or --algorithm=SUFFIX or STANDALONE) and
one without, on the same model,
timed side by side, alternating --rounds times (the median of each), at batch 1 and
--batch. With a
model that has a tokenizer (the default: SmolLM2-135M-Instruct, real weights) the
tasks are chats about a passage of the GPL-3 text Debian ships: `quote` (repeat it),
`edit` (repeat it with one word changed), `summarise`, greedy, and `chat`, a free
question sampled at temperature 1. Without one (--model-path of a random-weight
checkpoint) they are token patterns: `repeat` (the prompt's tokens again) and
`free`. The outputs are checked to be identical with and without drafts.

Reported per task: output tokens per second with and without drafts and their ratio
(timed on this host), the acceptance-length distribution (per verify step, how many
drafted tokens were accepted), and with --k1_counts (riscv64_step records of this
model's shape with verify kinds, e.g. `--shape=smollm2-135m --verify_drafts=1,2,3,4`)
the K1 projection: each step of the run priced at the counted cost of a step with its
draft count (the calibrated board model, 4 and 8 threads), tokens over the summed time,
beside the same for the run without drafts.

STANDALONE (a draft model): the target is the model's file dequantized to BF16 and the
draft its weights requantized to Q4_0 by llama.cpp's quantizer (--draft-model-path gives
another), kept quantized: the same model drafting for itself from a quarter of the bytes.
The default model ships as Q4_1 only, so the target's weights are Q4_1's values in BF16
and the draft differs from them by Q4_0's rounding, as a BF16 model's own Q4_0 file would.
Its K1 projection prices a step with k drafts as the target's verify step (mode full) plus
the draft's pass over the kept tokens (priced as a Q4_0 verify step of k) and its k - 1
further draft passes (Q4_0 decode steps): the counts need --modes=full,q4_0.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models.default_model import ensure_default_model
from rvascend.models.loader import load_model
from rvascend.policy import RvvPolicyConfig, install_rvv_policy
from rvascend.tokenizer.tokenizer import Tokenizer

FLAGS = flags.FLAGS
PASSAGE_SOURCE = "/usr/share/common-licenses/GPL-3"


def _define_flags() -> None:
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the served default model, SmolLM2-135M-Instruct).")
    flags.DEFINE_integer("batch", 4, "Sequences decoding together (besides batch 1).")
    flags.DEFINE_integer("output-len", 96, "Tokens generated per sequence, at most.")
    flags.DEFINE_integer("draft-tokens", 4, "--speculative-num-draft-tokens.")
    flags.DEFINE_integer("rounds", 5, "Runs of each engine, alternated (tok/s: their median).")
    flags.DEFINE_enum("algorithm", "NGRAM", ["NGRAM", "SUFFIX", "STANDALONE"], "The drafts set against none. "
                      "SUFFIX adds the task summarise_again: the summary asked for once more (its drafts can come "
                      "from the first). STANDALONE: a draft model (--draft-model-path).")
    flags.DEFINE_string("draft-model-path", None, "STANDALONE's draft model (default: the model's file requantized "
                        "to Q4_0 by llama.cpp's quantizer; the target is then the file dequantized to BF16).")
    flags.DEFINE_string("k1_counts", None, "riscv64_step jsonl with this model's decode and verifyK steps (mode "
                        "q4_0 if present, else full; context 512, one sequence): the K1 projection.")
    flags.DEFINE_string("output", "bench_results/speculative.jsonl", "jsonl file to append to.")


def _passage(words: int = 120) -> str:
    with open(PASSAGE_SOURCE, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    start = text.index("The licenses for most software")
    return " ".join(text[start:].split()[:words])


def _text_tasks(tokenizer: Tokenizer, batch: int, output_len: int) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    passage = _passage()
    asks = {
        "quote": f"Repeat the following passage exactly, word for word:\n\n{passage}",
        "edit": f"Repeat the following passage exactly, but write 'liberty' instead of the first 'freedom':\n\n"
                f"{passage}",
        "summarise": f"Summarise the following passage in two sentences, quoting its key phrases:\n\n{passage}",
        "chat": "What should I pack for a week of hiking in the mountains?",
    }
    tasks = {}
    for name, ask in asks.items():
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": ask}]))
        greedy = name != "chat"
        tasks[name] = ([ids] * batch, SamplingParams(max_tokens=output_len, temperature=0 if greedy else 1.0,
                                                     seed=None if greedy else 11, ignore_eos=False))
    return tasks


def _token_tasks(vocab: int, batch: int, output_len: int) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    text = [(17 * i + 5) % (vocab - 10) + 5 for i in range(output_len)]
    return {
        "repeat": ([text + [3] + text[:8] for _ in range(batch)],
                   SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)),
        "free": ([[(31 * i + 7 * b) % (vocab - 10) + 5 for i in range(24)] for b in range(batch)],
                 SamplingParams(max_tokens=output_len, temperature=1.0, seed=11, ignore_eos=True)),
    }


def _run(model, tokenizer, prompts, params, spec: bool, draft_tokens: int, algorithm: str = "NGRAM",
         again: bool = False, draft=None):
    """(tok/s, outputs, stats, steps by draft count) of the decode after every first token;
    `again`: the same requests ran once before on the engine (untimed)."""
    engine = Engine(model, tokenizer, EngineConfig(
        max_total_tokens=len(prompts) * (len(prompts[0]) + params.max_tokens + 32) + 64,
        max_running_requests=len(prompts), speculative_algorithm=algorithm if spec else None,
        speculative_num_draft_tokens=draft_tokens), draft_model=draft if spec else None)
    if again:
        engine.generate(prompts, params)
    seqs = [engine.add_request(p, params) for p in prompts]
    while any(s.prefilling or not s.output_ids for s in seqs):  # prompts and first tokens: not timed
        engine.step()
    done = sum(len(s.output_ids) for s in seqs)
    steps: collections.Counter[int] = collections.Counter()  # per sequence-step: its drafts
    t0 = time.perf_counter()
    while engine.has_work():
        running = [s for s in engine.scheduler.running if not s.prefilling]
        engine.step()
        for s in running:
            steps[len(s.draft)] += 1
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.output_ids) for s in seqs) - done
    return tokens / seconds, [s.output_ids for s in seqs], engine.stats(), engine.speculator.outcomes, steps, tokens


def _k1_step_seconds(path: str, mode: str = "") -> dict[int, dict[int, float]]:
    """Per thread count, per draft count: a K1 step's seconds for one sequence at context 512,
    of `mode`'s counts (default: q4_0 if present, else full)."""
    records = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    records = [r for r in records if r.get("bench") == "riscv64_step" and r["rows"] == 1 and r["context"] == 512]
    mode = mode or ("q4_0" if any(r["mode"] == "q4_0" for r in records) else "full")
    out: dict[int, dict[int, float]] = {4: {}, 8: {}}
    for r in records:
        if r["mode"] != mode or not (r["kind"] == "decode" or r["kind"].startswith("verify")):
            continue
        k = 0 if r["kind"] == "decode" else int(r["kind"][len("verify"):])
        for t in out:
            out[t][k] = 1.0 / r[f"k1_calibrated_tok_s_{t}_threads"]
    if 0 not in out[4]:
        raise ValueError(f"{path} has no decode step at context 512, one sequence, mode {mode}")
    return out


def _k1_tok_s(seconds: dict[int, float], steps: collections.Counter, tokens: int) -> float:
    """Tokens over the K1 time of the run's sequence-steps, each at the counted cost of its
    draft count (the nearest counted one above it, when it was not counted)."""
    counted = sorted(seconds)
    total = 0.0
    for k, n in steps.items():
        at = next((c for c in counted if c >= k), counted[-1])
        total += n * seconds[at]
    return tokens / total


def _with_draft_costs(target: dict[int, dict[int, float]], draft: dict[int, dict[int, float]]
                      ) -> dict[int, dict[int, float]]:
    """STANDALONE's step with j drafts: the target's verify step of j, the draft model's pass over
    the kept tokens and the drawn one (priced as its verify step of j) and its further passes for
    the next step's drafts (as many as this step's, less one: decode steps)."""
    return {t: {j: target[t][j] + draft[t].get(j, draft[t][max(draft[t])]) + max(j - 1, 0) * draft[t][0]
                for j in target[t]} for t in target}


def _standalone_models(path: str, draft_path: str | None):
    """(target, draft): the file dequantized to BF16, and `draft_path` (default: the file
    requantized to Q4_0 by llama.cpp) kept quantized; both under deterministic inference."""
    import tempfile

    from rvascend.build import llama_cpp

    if draft_path is None:
        draft_path = llama_cpp.quantize(path, os.path.join(tempfile.mkdtemp(), "draft-q4_0.gguf"), "Q4_0")
    target = load_model(path, torch.bfloat16, keep_quantized=False)
    draft = load_model(draft_path, torch.bfloat16, keep_quantized=True)
    for m in (target, draft):
        install_rvv_policy(m, RvvPolicyConfig(compile_mode="eager", deterministic=True))
    return target, draft


def main(argv: list[str]) -> int:
    del argv
    path = FLAGS["model-path"].value or ensure_default_model()
    draft = None
    if FLAGS.algorithm == "STANDALONE":
        model, draft = _standalone_models(path, FLAGS["draft-model-path"].value)
    else:
        model = load_model(path, torch.bfloat16, keep_quantized=True)
        install_rvv_policy(model, RvvPolicyConfig(compile_mode="eager", deterministic=True))
    try:
        tokenizer = Tokenizer(path)
    except (OSError, ValueError):
        tokenizer = None
    if tokenizer is not None and not os.path.exists(PASSAGE_SOURCE):
        raise FileNotFoundError(f"{PASSAGE_SOURCE} (Debian's base-files) holds the passage the tasks are about")
    k1 = None
    if FLAGS.k1_counts and FLAGS.algorithm == "STANDALONE":
        plain_k1 = _k1_step_seconds(FLAGS.k1_counts, "full")
        k1 = _with_draft_costs(plain_k1, _k1_step_seconds(FLAGS.k1_counts, "q4_0"))
    elif FLAGS.k1_counts:
        plain_k1 = k1 = _k1_step_seconds(FLAGS.k1_counts)
    records = []
    for batch in (1, FLAGS.batch):
        length = FLAGS["output-len"].value
        tasks = _text_tasks(tokenizer, batch, length) if tokenizer is not None else \
            _token_tasks(model.config.vocab_size, batch, length)
        if FLAGS.algorithm == "SUFFIX" and "summarise" in tasks:
            tasks["summarise_again"] = tasks["summarise"]
        for task, (prompts, params) in tasks.items():
            speeds = {False: [], True: []}
            runs = {}
            for _ in range(FLAGS.rounds):
                for spec in (False, True):
                    run = _run(model, tokenizer, prompts, params, spec, FLAGS["draft-tokens"].value,
                               FLAGS.algorithm, task.endswith("_again"), draft)
                    speeds[spec].append(run[0])
                    runs[spec] = run
            if runs[True][1] != runs[False][1]:
                raise RuntimeError(f"{task}: speculative decoding changed the output")
            stats, outcomes, steps, tokens = runs[True][2:]
            drafted, accepted = stats["spec_drafted_tokens"], stats["spec_accepted_tokens"]
            plain, spec = statistics.median(speeds[False]), statistics.median(speeds[True])
            lengths: collections.Counter[int] = collections.Counter()  # tokens a verify step yields
            for (_, j), n in outcomes.items():
                lengths[1 + j] += n
            record = {"model_path": path, "threads": torch.get_num_threads(), "task": task, "batch": batch,
                      "tok_s": plain, "spec_tok_s": spec, "speedup": spec / plain,
                      "tokens_per_step": tokens / max(1, sum(steps.values())),
                      "accept_rate": accepted / drafted if drafted else 0.0,
                      "acceptance_lengths": dict(sorted(lengths.items())),
                      "draft_counts": dict(sorted(steps.items()))}
            if k1 is not None and batch == 1:
                plain_steps, plain_tokens = runs[False][4], runs[False][5]
                for t in (4, 8):
                    record[f"k1_speedup_{t}t"] = (_k1_tok_s(k1[t], steps, tokens) /
                                                  _k1_tok_s(plain_k1[t], plain_steps, plain_tokens))
            records.append(record)
            logging.info("%s, batch %d: %.1f -> %.1f tok/s, acceptance lengths %s", task, batch, plain, spec,
                         record["acceptance_lengths"])
    columns = [("task", "task", "s"), ("batch", "B", "d"), ("tok_s", "tok/s", ".1f"),
               ("spec_tok_s", f"{FLAGS.algorithm} tok/s", ".1f"), ("speedup", "speed-up", ".2f"),
               ("tokens_per_step", "tokens/step/seq", ".2f"), ("accept_rate", "accepted", ".1%")]
    if k1 is not None:
        columns += [("k1_speedup_4t", "K1 x 4T", ".2f"), ("k1_speedup_8t", "K1 x 8T", ".2f")]
    print_table(records, columns)
    for r in records:
        print(f"{r['task']:10s} B {r['batch']}: acceptance lengths {r['acceptance_lengths']}")
    write_jsonl(FLAGS.output, records)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

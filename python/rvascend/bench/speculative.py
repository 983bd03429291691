"""What speculative decoding gives (`./dev bench --parts=speculative`).

One engine with --speculative-algorithm NGRAM (or --algorithm=SUFFIX or STANDALONE) and
one without, on the same model,
timed side by side, alternating --rounds times (the median of each), at batch 1 and
--batch. With a
model that has a tokenizer (the default: SmolLM2-135M-Instruct, real weights) the
tasks are chats about a passage of the GPL-3 text Debian ships: `quote` (repeat it),
`edit` (repeat it with one word changed), `summarise`, greedy, and `chat`, a free
question sampled at temperature 1, and `agent_replay`, a coding agent's transcript replayed
on one engine: four turns, each a file read back by a tool (the model's last answer,
resent), an edit, the whole file written out (greedy). Without one (--model-path of a random-weight
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
draft its weights quantized in memory to Q4_0 (--speculative-draft-model-quantization;
--draft-model-path gives another), the same model drafting for itself from a quarter of
the bytes. The default model ships as Q4_1 only, so the target's weights are Q4_1's
values in BF16 and the draft differs from them by Q4_0's rounding, as a BF16 model's own
Q4_0 would.
Its K1 projection prices a step with k drafts as the target's verify step (mode full) and
each pass the draft model ran at its row count (a pass of k + 1 rows as a verify step of k
in the draft's format): the counts need --modes=full and the draft's (q4_0 or q8_0).

The draft lengths are chosen by cost (engine/draft_cost.py): the timed runs by the costs
measured on this host, the K1 projection by a run given the board's counted costs (the
lengths the board would choose), at batch 1.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Callable

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.draft_cost import PassCosts, StepCosts
from rvascend.models.default_model import ensure_default_model
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy
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
    flags.DEFINE_string("draft-model-path", None, "STANDALONE's draft model (default: the target's weights "
                        "quantized in memory, --draft-model-quantization).")
    flags.DEFINE_enum("draft-model-quantization", "q4_0", ["q4_0", "q8_0"], "STANDALONE without --draft-model-path: "
                      "the format the target's weights draft in (--speculative-draft-model-quantization).")
    flags.DEFINE_string("k1_counts", None, "riscv64_step jsonl with this model's decode and verifyK steps (mode "
                        "q4_0 if present, else full; context 512, one sequence): the K1 projection.")
    flags.DEFINE_list("tasks", None, "Only these tasks (default: every one).")
    flags.DEFINE_string("output", "bench_results/speculative.jsonl", "jsonl file to append to.")


def _passage(words: int = 120) -> str:
    with open(PASSAGE_SOURCE, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    start = text.index("The licenses for most software")
    return " ".join(text[start:].split()[:words])


@dataclasses.dataclass
class _Task:
    prompts: list[list[int]]
    params: SamplingParams
    again: bool = False  # the same requests ran once before on the engine (untimed)
    # Turns after the first: each sequence's next prompt from its last prompt and answer.
    follow_ups: list[Callable[[list[int], list[int]], list[int]]] = dataclasses.field(default_factory=list)


# The agent replay's turns: the agent writes the file out with each edit, then reads it back
# (a tool's output resends what it wrote) before the next edit.
AGENT_EDITS = ("write 'liberty' instead of 'freedom'", "write 'programs' instead of 'software'",
               "write 'you' instead of 'users'", "write 'share' instead of 'distribute'")
AGENT_SYSTEM = ("You are a coding agent. You edit the file NOTES.txt: answer each request with the whole new "
                "file and nothing else.")


def _text_tasks(tokenizer: Tokenizer, batch: int, output_len: int) -> dict[str, _Task]:
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
        tasks[name] = _Task([ids] * batch, SamplingParams(max_tokens=output_len, temperature=0 if greedy else 1.0,
                                                          seed=None if greedy else 11, ignore_eos=False))
    tasks["agent_replay"] = _agent_replay(tokenizer, passage, batch, output_len)
    return tasks


def _agent_replay(tokenizer: Tokenizer, passage: str, batch: int, output_len: int) -> _Task:
    """A multi-turn tool-calling transcript replayed: read_file's output, an edit, the whole
    file written back (the model's answer), read_file again showing it, the next edit."""
    def turn(messages: list[dict[str, str]]) -> list[int]:
        return tokenizer.encode(tokenizer.apply_chat_template(messages))

    def read_file(text: str) -> str:
        return f"[tool read_file NOTES.txt]\n{text}\n[end of tool output]"

    first = [{"role": "system", "content": AGENT_SYSTEM},
             {"role": "user", "content": f"{read_file(passage)}\n\nIn NOTES.txt, {AGENT_EDITS[0]}."}]

    def follow_up(edit: str):
        def next_prompt(prompt: list[int], answer: list[int]) -> list[int]:
            text = tokenizer.decode(answer)
            messages = conversations.setdefault(tuple(prompt), list(first))
            messages = messages + [{"role": "assistant", "content": text},
                                   {"role": "user", "content": f"[tool write_file NOTES.txt: ok]\n{read_file(text)}"
                                                               f"\n\nNow {edit}."}]
            ids = turn(messages)
            conversations[tuple(ids)] = messages
            return ids
        return next_prompt

    conversations: dict[tuple[int, ...], list[dict[str, str]]] = {}
    return _Task([turn(first)] * batch, SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=False),
                 follow_ups=[follow_up(edit) for edit in AGENT_EDITS[1:]])


def _token_tasks(vocab: int, batch: int, output_len: int) -> dict[str, _Task]:
    text = [(17 * i + 5) % (vocab - 10) + 5 for i in range(output_len)]
    return {
        "repeat": _Task([text + [3] + text[:8] for _ in range(batch)],
                        SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)),
        "free": _Task([[(31 * i + 7 * b) % (vocab - 10) + 5 for i in range(24)] for b in range(batch)],
                      SamplingParams(max_tokens=output_len, temperature=1.0, seed=11, ignore_eos=True)),
    }


@dataclasses.dataclass
class _Run:
    """One engine's decode after every first token (`_run`)."""
    tok_s: float
    outputs: list[list[int]]
    stats: dict[str, float]
    outcomes: collections.Counter    # verify steps by (drafts, accepted)
    steps: collections.Counter       # sequence-steps by their draft count
    tokens: int
    draft_passes: collections.Counter  # the draft model's passes by row count
    draft_share: float               # of the decode's time, in the draft model's passes


def _run(model, tokenizer, task: _Task, spec: bool, draft_tokens: int, algorithm: str = "NGRAM", draft=None,
         step_costs: StepCosts | None = None) -> _Run:
    """The decode after every first token, of each turn on one engine; `step_costs`: the
    draft lengths chosen by these, not measured ones."""
    prompts, params = task.prompts, task.params
    # A turn adds the answer twice (as the assistant's, and read back by the tool) and its framing.
    longest = len(prompts[0]) + (1 + len(task.follow_ups)) * (2 * params.max_tokens + 160)
    engine = Engine(model, tokenizer, EngineConfig(
        max_total_tokens=len(prompts) * (longest + 32) + 64, max_running_requests=len(prompts),
        speculative_algorithm=algorithm if spec else None, speculative_num_draft_tokens=draft_tokens),
        draft_model=draft if spec else None, step_costs=step_costs if spec else None)
    drafter = engine.speculator.draft_model
    if task.again:
        engine.generate(prompts, params)
    steps: collections.Counter[int] = collections.Counter()  # per sequence-step: its drafts
    passes: collections.Counter[int] = collections.Counter()
    tokens, seconds, draft_seconds, outputs = 0, 0.0, 0.0, []
    for follow_up in [None] + task.follow_ups:
        if follow_up is not None:
            prompts = [follow_up(p, out) for p, out in zip(prompts, outputs[-len(prompts):])]
        seqs = [engine.add_request(p, params) for p in prompts]
        while any(s.prefilling or not s.output_ids for s in seqs):  # prompts and first tokens: not timed
            engine.step()
        done = sum(len(s.output_ids) for s in seqs)
        passes_before = collections.Counter(drafter.passes) if drafter else collections.Counter()
        draft_before = drafter.seconds if drafter else 0.0
        t0 = time.perf_counter()
        while engine.has_work():
            running = [s for s in engine.scheduler.running if not s.prefilling]
            engine.step()
            for s in running:
                steps[len(s.draft)] += 1
        seconds += time.perf_counter() - t0
        tokens += sum(len(s.output_ids) for s in seqs) - done
        if drafter:
            passes += drafter.passes - passes_before
            draft_seconds += drafter.seconds - draft_before
        outputs += [s.output_ids for s in seqs]
    return _Run(tokens / seconds, outputs, engine.stats(), engine.speculator.outcomes, steps, tokens, passes,
                draft_seconds / seconds)


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


def _k1_tok_s(seconds: dict[int, float], run: _Run, draft: dict[int, float] | None = None) -> float:
    """Tokens over the K1 time of the run's sequence-steps, each at the counted cost of its
    draft count (the nearest counted one above it, when it was not counted), plus the draft
    model's passes it ran (`draft`: its counted step of k drafts prices a pass of k + 1 rows,
    other row counts read off their line: draft_cost.PassCosts)."""
    counted = sorted(seconds)
    total = 0.0
    for k, n in run.steps.items():
        at = next((c for c in counted if c >= k), counted[-1])
        total += n * seconds[at]
    if draft is not None:
        price = PassCosts(_by_rows(draft))
        total += sum(n * price(rows) for rows, n in run.draft_passes.items())
    return run.tokens / total


def _by_rows(seconds: dict[int, float]) -> dict[int, float]:
    """A pass's cost by its row count from a step's cost by its draft count (k drafts: k + 1 rows)."""
    return {k + 1: t for k, t in seconds.items()}


def _standalone_models(path: str, draft_path: str | None, quantization: str):
    """(target, draft): the file dequantized to BF16, and `draft_path` kept quantized or, by
    default, the target's weights quantized in memory to `quantization`
    (--speculative-draft-model-quantization's draft); both under deterministic inference."""
    from rvascend.models.quantized_copy import quantized_copy

    target = load_model(path, torch.bfloat16, keep_quantized=False)
    draft = load_model(draft_path, torch.bfloat16, keep_quantized=True) if draft_path else \
        quantized_copy(target, quantization)
    for m in (target, draft):
        install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    return target, draft


def _k1_prices():
    """Per thread count, the target's step by draft count and the draft model's (None
    without --k1_counts; the draft's only for STANDALONE)."""
    if not FLAGS.k1_counts:
        return None, None
    if FLAGS.algorithm != "STANDALONE":
        return _k1_step_seconds(FLAGS.k1_counts), None
    if FLAGS["draft-model-path"].value:
        raise ValueError("--k1_counts prices the draft model's passes with the counts of the target's weights in "
                         "--draft-model-quantization's format: a --draft-model-path draft is not projected")
    quantization = FLAGS["draft-model-quantization"].value
    return _k1_step_seconds(FLAGS.k1_counts, "full"), _k1_step_seconds(FLAGS.k1_counts, quantization)


def _measure(path: str, model, tokenizer, draft, name: str, task: _Task, batch: int, k1, k1_draft) -> dict:
    """One task's record: both engines alternated --rounds times (tok/s: the medians), the
    outputs checked equal, and at batch 1 with K1 prices the board's projection."""
    speeds: dict[bool, list[float]] = {False: [], True: []}
    runs: dict[bool, _Run] = {}
    for _ in range(FLAGS.rounds):
        for spec in (False, True):
            runs[spec] = _run(model, tokenizer, task, spec, FLAGS["draft-tokens"].value, FLAGS.algorithm, draft)
            speeds[spec].append(runs[spec].tok_s)
    if runs[True].outputs != runs[False].outputs:
        raise RuntimeError(f"{name}: speculative decoding changed the output")
    run = runs[True]
    drafted, accepted = run.stats["spec_drafted_tokens"], run.stats["spec_accepted_tokens"]
    plain, spec = statistics.median(speeds[False]), statistics.median(speeds[True])
    lengths: collections.Counter[int] = collections.Counter()  # tokens a verify step yields
    for (_, j), n in run.outcomes.items():
        lengths[1 + j] += n
    record = {"model_path": path, "threads": torch.get_num_threads(), "task": name,
              "batch": batch, "tok_s": plain, "spec_tok_s": spec, "speedup": spec / plain,
              "tokens_per_step": run.tokens / max(1, sum(run.steps.values())),
              "accept_rate": accepted / drafted if drafted else 0.0,
              "acceptance_lengths": dict(sorted(lengths.items())),
              "draft_counts": dict(sorted(run.steps.items())), "draft_share": run.draft_share}
    if k1 is not None and batch == 1:
        for t in (4, 8):
            # The draft lengths the board would choose: the same engine given the board's
            # counted pass costs (its host timing is not reported).
            costs = StepCosts(_by_rows(k1[t]), _by_rows(k1_draft[t]) if k1_draft else {})
            board = _run(model, tokenizer, task, True, FLAGS["draft-tokens"].value, FLAGS.algorithm, draft, costs)
            if board.outputs != runs[False].outputs:
                raise RuntimeError(f"{name}: speculative decoding changed the output")
            record[f"k1_speedup_{t}t"] = (_k1_tok_s(k1[t], board, k1_draft[t] if k1_draft else None) /
                                          _k1_tok_s(k1[t], runs[False]))
            record[f"k1_tokens_per_step_{t}t"] = board.tokens / max(1, sum(board.steps.values()))
    logging.info("%s, batch %d: %.1f -> %.1f tok/s, acceptance lengths %s", name, batch, plain, spec,
                 record["acceptance_lengths"])
    return record


def main(argv: list[str]) -> int:
    del argv
    path = FLAGS["model-path"].value or ensure_default_model()
    draft = None
    if FLAGS.algorithm == "STANDALONE":
        model, draft = _standalone_models(path, FLAGS["draft-model-path"].value,
                                          FLAGS["draft-model-quantization"].value)
    else:
        model = load_model(path, torch.bfloat16, keep_quantized=True)
        install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    try:
        tokenizer = Tokenizer(path)
    except (OSError, ValueError):
        tokenizer = None
    if tokenizer is not None and not os.path.exists(PASSAGE_SOURCE):
        raise FileNotFoundError(f"{PASSAGE_SOURCE} (Debian's base-files) holds the passage the tasks are about")
    k1, k1_draft = _k1_prices()
    records = []
    for batch in (1, FLAGS.batch):
        length = FLAGS["output-len"].value
        tasks = _text_tasks(tokenizer, batch, length) if tokenizer is not None else \
            _token_tasks(model.config.vocab_size, batch, length)
        if FLAGS.algorithm == "SUFFIX" and "summarise" in tasks:
            tasks["summarise_again"] = dataclasses.replace(tasks["summarise"], again=True)
        if FLAGS.tasks:
            unknown = set(FLAGS.tasks) - set(tasks)
            if unknown:
                raise ValueError(f"--tasks: no task {sorted(unknown)} (there are {sorted(tasks)})")
            tasks = {name: task for name, task in tasks.items() if name in FLAGS.tasks}
        records += [_measure(path, model, tokenizer, draft, name, task, batch, k1, k1_draft)
                    for name, task in tasks.items()]
    columns = [("task", "task", "s"), ("batch", "B", "d"), ("tok_s", "tok/s", ".1f"),
               ("spec_tok_s", f"{FLAGS.algorithm} tok/s", ".1f"), ("speedup", "speed-up", ".2f"),
               ("tokens_per_step", "tokens/step/seq", ".2f"), ("accept_rate", "accepted", ".1%")]
    if FLAGS.algorithm == "STANDALONE":
        columns.append(("draft_share", "draft passes", ".0%"))
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

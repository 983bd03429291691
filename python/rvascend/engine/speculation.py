"""Speculative decoding's engine side: what each sequence drafts for a step, the MTP
head's drafts for the next, and how the drafts did.

The drafters are engine/ngram_draft.py (NGRAM: the request's own text),
engine/suffix_draft.py (SUFFIX: recent requests' text too), engine/mtp_draft.py (NEXTN:
Qwen3.5's MTP head) and engine/standalone_draft.py (STANDALONE: a draft model). A decode row verifies its drafts in
the same forward pass (model_runner.py samples every drafted position as decoding
would, so the output is exactly decoding's); the step's commit (engine.py) keeps the
run the target accepted and records it here.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import torch
from absl import logging

from rvascend.engine import mtp_draft
from rvascend.engine.draft_cost import StepCosts, calibrate, choose_lengths, should_probe
from rvascend.engine.model_runner import Plan, Row
from rvascend.engine.ngram_draft import DraftBudget, NgramIndex
from rvascend.engine.sequence import Sequence
from rvascend.engine.standalone_draft import DraftModel
from rvascend.engine.suffix_draft import SuffixCorpus

ALGORITHMS = ("NGRAM", "SUFFIX", "NEXTN", "STANDALONE")
# The algorithms whose drafts a model makes after each step, for the next one (seq.mtp_draft).
MODEL_DRAFTED = ("NEXTN", "STANDALONE")


class Speculator:
    """One engine's drafting (None algorithm: off) and its acceptance counts."""

    def __init__(self, algorithm: Optional[str], num_draft_tokens: int, ngram_min_window: int,
                 ngram_max_window: int, has_mtp: bool, architecture: str, suffix_tokens: int = 1 << 16,
                 draft_model: Optional[DraftModel] = None, costs: Optional[StepCosts] = None) -> None:
        if algorithm not in (None, *ALGORITHMS):
            raise ValueError(f"--speculative-algorithm {algorithm!r} is not supported ({', '.join(ALGORITHMS)})")
        if algorithm == "NEXTN" and not has_mtp:
            raise ValueError(f"--speculative-algorithm NEXTN drafts with the checkpoint's MTP head, and this "
                             f"{architecture} model was loaded without one (load_model(..., mtp=True))")
        if (algorithm == "STANDALONE") != (draft_model is not None):
            raise ValueError("--speculative-algorithm STANDALONE drafts with a draft model (--speculative-draft-model-"
                             "path or --speculative-draft-model-quantization), and only it does: give both or neither")
        self.draft_model = draft_model
        # The pass costs the draft lengths are chosen by (draft_cost.py); None: as the budgets ask.
        self.costs = costs if algorithm is not None else None
        if draft_model is not None:
            draft_model.costs = self.costs
        if algorithm is not None and not 1 <= num_draft_tokens <= 16:
            raise ValueError("--speculative-num-draft-tokens must be 1 to 16")
        if not 1 <= ngram_min_window <= ngram_max_window:
            raise ValueError("the n-gram match windows need 1 <= min <= max")
        self.algorithm = algorithm
        self.num_draft_tokens = num_draft_tokens
        self._windows = (ngram_min_window, ngram_max_window)
        # SUFFIX: recent requests' text per API key (suffix_draft.py), beside the request's own.
        self.corpus = SuffixCorpus(suffix_tokens, ngram_min_window, ngram_max_window) \
            if algorithm == "SUFFIX" else None
        self.drafted = self.accepted = 0  # draft tokens verified, and accepted
        self.failed_passes = 0  # drafting passes (NEXTN, STANDALONE) that raised: their steps drafted nothing
        # Verify steps by (drafts, accepted) per sequence: the acceptance-length distribution.
        self.outcomes: collections.Counter[tuple[int, int]] = collections.Counter()

    @property
    def slots_per_sequence(self) -> int:
        """The K/V rows (and, for hybrids, state slots) one sequence's verify step adds beyond
        a decode step's."""
        return self.num_draft_tokens if self.algorithm else 0

    def draft(self, seq: Sequence, room: int, eos_ids: set[int]) -> list[int]:
        """The tokens `seq` drafts for this step, at most `room`: none when speculation is
        off, before its grammar applies, or where its drafts have been doing badly; under a
        grammar, only the draft's prefix the grammar allows, ending at its first EOS."""
        seq.draft = []
        if self.algorithm is None or (seq.matcher is not None and not seq.grammar_active):
            return seq.draft
        if seq.draft_budget is None:
            seq.draft_budget = DraftBudget(self.num_draft_tokens)
            if self.algorithm not in MODEL_DRAFTED:
                seq.ngram = NgramIndex(*self._windows)
        k = min(seq.draft_budget.next_k(), room)
        if k > 0:
            if self.algorithm in MODEL_DRAFTED:
                seq.draft = seq.mtp_draft[:k]
            elif self.corpus is None:
                seq.draft = seq.ngram.propose(seq.prompt_ids, seq.output_ids, k)
            else:
                n, seq.draft = seq.ngram.match(seq.prompt_ids, seq.output_ids, k)
                if n < self._windows[1]:
                    # The longer match drafts: another request's text where it continues more of this one.
                    m, other = self.corpus.match(seq.owner, seq.tokens(max(0, seq.num_tokens - self._windows[1]), seq.num_tokens), k)
                    if m > n:
                        seq.draft = other
            if seq.matcher is not None and seq.draft:
                # Nothing follows an EOS under a grammar, and the matcher never takes a drafted
                # EOS (GrammarBackend._draft_masks): the draft ends at its first one.
                end = next((i + 1 for i, t in enumerate(seq.draft) if t in eos_ids), len(seq.draft))
                seq.draft = seq.draft[:seq.matcher.validate_tokens(seq.draft[:end])]
        return seq.draft

    def draft_step(self, decoding: list[Sequence], rooms: list[int], eos_ids: set[int],
                   batch_rows: int) -> list[list[int]]:
        """Each decoding sequence's drafts for a step whose target pass has `batch_rows` rows
        without them, at most `rooms`: `draft`'s, cut to the lengths the cost chooses (a
        draft model's were chosen when it drafted them)."""
        drafts = [self.draft(seq, room, eos_ids) for seq, room in zip(decoding, rooms)]
        if self.costs is None or self.algorithm == "STANDALONE":
            return drafts
        asking = [i for i, d in enumerate(drafts) if d]
        if asking:
            budgets = [decoding[i].draft_budget for i in asking]
            keep = self.lengths(budgets, [b.acceptance for b in budgets], [len(drafts[i]) for i in asking],
                                len(decoding), batch_rows)
            for i, n in zip(asking, keep):
                decoding[i].draft = drafts[i] = drafts[i][:n]
        return drafts

    def lengths(self, budgets: list[DraftBudget], acceptance: list[float], caps: list[int], sequences: int,
                batch_rows: int, behind: Optional[list[int]] = None) -> list[int]:
        """How many drafts each sequence asking for up to `caps` makes: what the cost
        chooses (draft_cost.py), or the caps with no cost model; one the cost leaves without
        drafts probes now and then (draft_cost.should_probe; `behind`: the positions a draft
        model would first have to catch up for it)."""
        if self.costs is None:
            return list(caps)
        out = choose_lengths(acceptance, caps, self.costs, sequences, batch_rows, self.algorithm == "STANDALONE")
        for i, budget in enumerate(budgets):
            if out[i] > 0:
                budget.idle = budget.probes = 0
                continue
            budget.idle += 1
            if should_probe(budget, behind[i] if behind else 0, self.costs, sequences):
                out[i], budget.idle, budget.probes = caps[i], 0, budget.probes + 1
        return out

    def calibrate(self, model, pool) -> None:
        """Measured costs start from the passes of one sequence verifying 1 .. k + 1 rows, timed
        now (draft_cost.calibrate), for the target (attention-only: a hybrid's would need state
        slots; its costs are learned from its steps alone) and the draft model."""
        if self.costs is None or self.costs.target[1].fixed or self.algorithm is None:
            return
        rows = 1 + self.num_draft_tokens
        if model.config.linear_attention is None:
            calibrate(self.costs.target[1], model, pool, rows)
        if self.draft_model is not None:
            calibrate(self.costs.draft[1], self.draft_model.model, self.draft_model.pool, rows + 1)
        logging.info("speculative pass costs measured (ms by rows, one sequence): target %s; draft model %s",
                     _ms(self.costs.target[1]), _ms(self.costs.draft[1]) if self.draft_model is not None else "none")

    def target_pass(self, plan: Plan, seconds: float) -> None:
        """A decode step's target pass took `seconds` (measured costs; prompt chunks' steps are not)."""
        if self.costs is not None and not any(row.prefill for row in plan.rows):
            self.costs.add(self.costs.target, len(plan.rows), int(plan.batch.input_ids.shape[0]), seconds)

    def flush(self) -> None:
        """Forgets every request's text (SUFFIX's corpus)."""
        if self.corpus is not None:
            self.corpus = SuffixCorpus(self.corpus.max_tokens, *self._windows)

    def finished(self, seq: Sequence) -> None:
        """SUFFIX: a request that ended (not with an error) adds its text to its key's corpus."""
        if self.corpus is not None and seq.error is None and seq.output_ids:
            self.corpus.add(seq.owner, seq.prompt_ids + seq.output_ids)

    def record(self, row: Row) -> None:
        """How a verify row's drafts did (a failed row accepted none)."""
        accepted = len(row.sampled) - 1 if row.error is None else 0
        row.seq.draft_budget.record(row.drafts, accepted)
        self.drafted += row.drafts
        self.accepted += accepted
        self.outcomes[(row.drafts, accepted)] += 1

    def model_drafts(self, model, pool, plan: Plan, context_length: int,
                     lend: Callable[[int], list[int]], give_back: Callable[[list[int]], None]) -> None:
        """NEXTN and STANDALONE: the drafting model's pass over this step's kept positions and
        its drafts for the sequences' next steps, into the rows; nothing is committed."""
        if self.algorithm not in ("STANDALONE", "NEXTN"):
            return
        try:
            if self.algorithm == "STANDALONE":
                self.draft_model.draft(plan.rows, self.num_draft_tokens, context_length, lend, give_back,
                                       self.lengths)
            else:
                self._nextn_drafts(model, pool, plan, context_length, lend, give_back)
        except Exception as e:  # noqa: BLE001 - drafts are proposals: the step goes on without them
            # The target's pass and its samples stand; what the drafting pass wrote (the MTP
            # layer's K/V at this step's positions, or the draft model's own cache) feeds only
            # later proposals, which verification keeps out of the output.
            self.failed_passes += 1
            if self.failed_passes == 1:  # the first with its traceback; a repeated one is counted (stats)
                logging.warning("the %s drafting pass failed: this step drafts nothing", self.algorithm,
                                exc_info=True)
            else:
                logging.log_every_n_seconds(logging.WARNING, "the %s drafting pass failed (%s: %s): this step "
                                            "drafts nothing (%d failed passes)", 60, self.algorithm,
                                            type(e).__name__, e, self.failed_passes)
            for row in plan.rows:
                if row.error is None:
                    row.next_draft = []  # never the last step's draft again: its positions have moved on

    def _nextn_drafts(self, model, pool, plan: Plan, context_length: int,
                      lend: Callable[[int], list[int]], give_back: Callable[[list[int]], None]) -> None:
        """NEXTN: the MTP head over this step's kept positions, its drafts into the rows."""
        rows, mtp_rows, start = [], [], 0
        for row in plan.rows:
            seq, first = row.seq, start
            start += row.new
            if row.error is not None:
                continue
            if row.prefill:  # every prompt position; the last one's next token is the sample
                end = seq.prefilled + row.new
                after = seq.prompt_ids[seq.prefilled + 1:end + 1]
                if end == len(seq.prompt_ids):
                    if not row.sampled:
                        continue
                    after = after + [row.sampled[0].token]
                mtp_rows.append(mtp_draft.MtpRow(seq, first, row.new, after, row.fresh, row.sample_row is not None,
                                                 len(seq.output_ids) + len(row.sampled)))
            else:  # the input token and the accepted drafts; the next tokens are what was drawn
                kept = len(row.sampled)
                mtp_rows.append(mtp_draft.MtpRow(seq, first, kept, [s.token for s in row.sampled], row.fresh[:kept],
                                                 True, len(seq.output_ids) + kept))
            rows.append(row)
        with torch.inference_mode():
            drafts = mtp_draft.draft(model, pool, plan.batch, mtp_rows, self.num_draft_tokens, context_length, lend,
                                     give_back)
        for row, d in zip(rows, drafts):
            row.next_draft = d


def _ms(costs) -> str:
    return ", ".join(f"{rows}: {1000 * seconds:.2f}" for rows, seconds in sorted(costs.table.items())) or "none yet"

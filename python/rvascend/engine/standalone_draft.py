"""STANDALONE drafts: a second, cheaper model of the same vocabulary drafts each sequence's
next tokens (SGLang's --speculative-algorithm STANDALONE --speculative-draft-model-path; the
target's own weights in a smaller format are the usual draft).

The draft model keeps its own K/V pool, slot for slot beside the target's: after each step
it runs over the positions the step kept (a prompt chunk; a decode row's input token and
its accepted drafts) into the same slot numbers, so wherever the target's pool holds a
position, the prefix cache's included, the draft's pool does too. In the same pass it runs
the token the step drew next, in a lent slot, and that position's logits give the first
draft; each further draft feeds the one before, one position a pass, in lent slots. The
lent slots go back within the step (the next step runs the drawn token again in its own
slot, for both models). A greedy sequence's drafts are the draft model's argmax; a sampled
one's are drawn from the draft's logits with the noise the target's draw at that position
will use (sampler.propose), so they agree wherever the two distributions are close.
Verification keeps the output exactly the target's whatever the drafts are.

How many tokens a sequence drafts next is chosen by cost (draft_cost.py, through
Speculator.lengths). A sequence given none is left out of the draft's passes, which are
most of what drafting costs; the pass before it drafts again runs the positions it
skipped (from its own slots, as a prompt chunk would) before its kept ones.

Everything written is in this step's fresh slots or lent ones, or a sequence's own slots
for positions it skipped (the same values whoever writes them: the tokens before are the
same), so a failed step is dropped as any other. Pages the hierarchical cache loads from host memory or disk are the
target's K/V only, and a cached prefix may hold positions its writer skipped: there the
draft's pool has whatever those slots held, and its drafts are worse (never wrong).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Optional

import numpy as np
import torch
from absl import logging

from rvascend.engine import sampler
from rvascend.engine.draft_cost import StepCosts
from rvascend.engine.ngram_draft import DraftBudget
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool


class DraftModel:
    """A draft model and its K/V pool of `pool_slots` slots (the target's count)."""

    def __init__(self, model: CausalLM, target: CausalLM, pool_slots: int, max_catch_up: int = 512) -> None:
        """`max_catch_up`: positions a sequence's skipped ones are run in per step, at most
        (the prompt chunk's size), so no pass stalls a step longer than a chunk would."""
        config = model.config
        if config.linear_attention is not None:
            raise ValueError(f"the draft model ({config.architecture}) has recurrent layers: a STANDALONE draft "
                             "model must be attention-only (its states would have to follow every acceptance)")
        if config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({config.vocab_size} tokens) is not the target's "
                             f"({target.config.vocab_size}): a draft token must mean the same token")
        self.model = model
        self.costs: Optional[StepCosts] = None  # measured pass costs (Speculator's), when the cost chooses
        self.passes: collections.Counter[int] = collections.Counter()  # passes run, by row count
        self.seconds = 0.0  # spent in them
        self.max_positions = config.max_position_embeddings
        self.max_catch_up = max(1, max_catch_up)
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(config, pool_slots, dtype)
        # Per slot, what the draft's pool holds there: position * vocabulary + token (-1: nothing),
        # so a sequence whose prefix comes from the cache catches up what its writer skipped.
        self.vocab = config.vocab_size
        self.tags = np.full(pool_slots, -1, dtype=np.int64)
        logging.info("STANDALONE draft model: %s, %d layers, K/V pool of %d slots (%.1f MiB)", config.architecture,
                     config.num_hidden_layers, pool_slots, pool_slots * KVPool.bytes_per_token(config, dtype) / 2**20)

    def draft(self, rows, k: int, context_length: int, lend: Callable[[int], list[int]],
              give_back: Callable[[list[int]], None], choose: Callable[..., list[int]]) -> None:
        """Writes the step's kept positions into the draft's pool and sets each decoding row's
        `next_draft` (up to k tokens, as many as `choose` gives it: Speculator.lengths) for
        its next step. A sequence given none is left out of the passes (its positions wait
        for the pass before it drafts again). `rows`: the step's (model_runner) rows."""
        started, in_passes = time.perf_counter(), self.seconds
        limit = min(context_length, self.max_positions)
        items, budgets, acceptance, caps, behind = [], [], [], [], []
        for row in rows:
            seq = row.seq
            if row.error is not None:
                continue
            if row.prefill:
                tokens, start, kept = seq.prompt_ids[seq.prefilled:seq.prefilled + row.new], seq.prefilled, row.fresh
                drawn = row.sampled[0].token if row.sample_row is not None and row.sampled else None
            else:
                if not row.sampled:
                    continue
                n = len(row.sampled)  # the input token and the accepted drafts
                tokens = [seq.last_token] + [s.token for s in row.sampled[:-1]]
                start, kept, drawn = seq.num_tokens - 1, row.fresh[:n], row.sampled[-1].token
            if seq.draft_budget is None:
                seq.draft_budget = DraftBudget(k)
            # The budget once this step's drafts are recorded (the commit records them).
            ahead = seq.draft_budget.after(row.drafts, len(row.sampled) - 1 if row.drafts else 0)
            synced = self._held(seq, start) if seq.draft_synced is None else seq.draft_synced
            item = _Item(row, tokens, start, kept, drawn, synced, min(start + len(tokens), synced + self.max_catch_up),
                         first_output=len(seq.output_ids) + len(row.sampled))
            if drawn is not None:
                row.next_draft = []  # whatever happens below, never the last step's draft again
                # As many as the budget will ask next, at most k, none past the context's end.
                cap = max(0, min(ahead.next_k(), k, limit - (start + len(tokens))))
                if cap > 0:
                    items_asking = len(caps)
                    budgets.append(seq.draft_budget)
                    acceptance.append(ahead.acceptance)
                    caps.append(cap)
                    behind.append(0 if row.prefill else start - synced)  # prompt chunks run anyway
                    item.asking = items_asking
            items.append(item)
        lengths = choose(budgets, acceptance, caps, len(items), len(items), behind) if caps else []
        for item in items:
            if item.asking is not None:
                # Only once its skipped positions are all run this step (catching up in chunks).
                item.want = lengths[item.asking] if item.upto == item.end else 0
                item.run = lengths[item.asking] > 0
        # A decode row drafting nothing next skips the passes; prompt chunks always run.
        items = [item for item in items if item.row.prefill or item.run]
        if not items:
            return
        wanted = [item for item in items if item.want > 0]
        lent = lend(sum(item.want for item in wanted)) if wanted else []
        left = len(lent)  # too few free slots: the first rows draft, as many as there are
        for item in wanted:
            item.want = min(item.want, left)
            left -= item.want
        try:
            self._run(items, lent)
        finally:
            give_back(lent)
        if wanted and self.costs is not None:  # what drafting costs beside the passes: batches, slots
            self.costs.add_overhead(time.perf_counter() - started - (self.seconds - in_passes))

    def _held(self, seq, start: int) -> int:
        """How many of the sequence's first `start` positions the draft's pool holds (a prefix
        from the cache: those its writer ran through the draft), the first time it is seen."""
        if start == 0:
            return 0
        tokens = np.asarray(seq.tokens(0, start), dtype=np.int64)
        want = np.arange(start, dtype=np.int64) * self.vocab + tokens
        held = self.tags[np.asarray(seq.slots[:start], dtype=np.int64)] == want
        return start if held.all() else int(held.argmin())

    def _run(self, items: list["_Item"], lent: list[int]) -> None:
        at = 0
        drafting = [item for item in items if item.want > 0]
        for item in drafting:
            item.lent, at = lent[at:at + item.want], at + item.want
        ids, positions, new_lens, prefix_lens, kv_slots, write, logit_rows = [], [], [], [], [], [], []
        held_slots, held_tags = [], []
        for item in items:
            seq = item.row.seq
            # Positions it skipped while it drafted nothing (those it has not, from its cached
            # prefix's), then the step's own, as far as `upto`.
            behind = seq.tokens(item.synced, min(item.start, item.upto))
            own = item.tokens[:max(0, item.upto - item.start)]
            kept = item.kept[:len(own)]
            extra = [item.drawn] if item.want > 0 else []  # only a drafting row runs the drawn token
            ran = seq.slots[item.synced:min(item.start, item.upto)] + kept
            ids.extend(behind + own + extra)
            positions.extend(range(item.synced, item.upto + len(extra)))
            new_lens.append(len(behind) + len(own) + len(extra))
            prefix_lens.append(item.synced)
            kv_slots.append(seq.kv_slot_tensor(kept + item.lent[:len(extra)])[:item.upto + len(extra)])
            write.extend(ran + item.lent[:len(extra)])
            held_slots.extend(ran)
            held_tags.extend(p * self.vocab + t for p, t in zip(range(item.synced, item.upto), behind + own))
            if extra:
                logit_rows.append(len(ids) - 1)
        batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                             new_lens, prefix_lens, kv_slots, torch.tensor(write, dtype=torch.long),
                             logit_rows=torch.tensor(logit_rows, dtype=torch.long))
        with torch.inference_mode():
            first = self._pass(batch, drafting, 0)
            self.tags[held_slots] = held_tags
            for item in items:
                item.row.draft_synced = item.upto
            if not drafting:
                return
            for item, t in zip(drafting, first):
                item.out = [t]
            for j in range(1, max(item.want for item in drafting)):  # draft j + 1, after draft j
                going = [item for item in drafting if item.want > j]
                chain = ForwardBatch(
                    torch.tensor([item.out[-1] for item in going], dtype=torch.long),
                    torch.tensor([item.end + j for item in going], dtype=torch.long),
                    [1] * len(going), [item.end + j for item in going],
                    [item.row.seq.kv_slot_tensor(item.kept + item.lent[:j + 1]) for item in going],
                    torch.tensor([item.lent[j] for item in going], dtype=torch.long))
                for item, t in zip(going, self._pass(chain, going, j)):
                    item.out.append(t)
        for item in drafting:
            item.row.next_draft = item.out

    def _pass(self, batch: ForwardBatch, drafting: list["_Item"], j: int) -> list[int]:
        """One forward pass of the draft model and the `drafting` items' draft j from its logits
        (none: a pass that drafts nothing); their time joins the measured costs (a sampled
        proposal is a draw over the vocabulary, one per row, as the pass's rows are)."""
        started = time.perf_counter()
        logits = self.model(batch, self.pool)
        tokens = _proposals(logits, drafting, j) if drafting else []
        seconds, rows = time.perf_counter() - started, int(batch.input_ids.shape[0])
        self.passes[rows] += 1
        self.seconds += seconds
        if self.costs is not None:
            self.costs.add(self.costs.draft, len(batch.new_lens), rows, seconds)
        return tokens


@dataclasses.dataclass(eq=False)
class _Item:
    """One row's part in the draft's passes."""
    row: object
    tokens: list[int]        # the step's kept positions' tokens, from `start`
    start: int
    kept: list[int]          # their slots
    drawn: Optional[int]     # the token the step drew next (None: a prompt chunk that samples nothing)
    synced: int              # the draft's pool holds this sequence's positions before this
    upto: int                # this step's pass runs its positions up to this (end: all)
    asking: Optional[int] = None  # its index among the rows asking for drafts
    run: bool = False        # the cost gave it drafts: its positions run this step
    want: int = 0            # drafts it makes for its next step
    first_output: int = 0    # the output index its first draft stands for
    lent: list[int] = dataclasses.field(default_factory=list)
    out: list[int] = dataclasses.field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def _proposals(logits: torch.Tensor, items: list[_Item], j: int) -> list[int]:
    """Each item's draft j from its row of the draft's logits."""
    return sampler.proposals(logits, [item.row.seq for item in items], [item.first_output + j for item in items])


def check_tokenizers(target, draft, draft_path: str) -> None:
    """A draft model must tokenize as the target does (tokenizer/tokenizer.py's Tokenizers): the
    same vocabulary, added tokens included, and the same special tokens; refused otherwise.
    (Compared as data: a GGUF's tokenizer and the same one in a directory differ as text.)"""
    def what(tok):
        return (tok.vocabulary(), tok.bos_token, tok.eos_token)
    if what(target) != what(draft):
        raise ValueError(f"--speculative-draft-model-path {draft_path}: its tokenizer is not the target's (a draft "
                         "token id must be the same text in both models)")

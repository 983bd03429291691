"""NEXTN drafts: Qwen3.5's MTP head (models/qwen3_5_mtp.py) run after each step's sampling.

Position i's input to the head is the target's hidden state at i and the token at i + 1, so
a position enters the head's K/V once its next token is known: a prompt chunk's positions in
the step that prefills them (the prompt gives the next token, the step's sample the last
one's), a verify step's kept positions once their acceptance is drawn (the accepted drafts
and the target's own token). The head's output at a sequence's last kept position gives the
first draft token (greedy, its argmax; sampled, drawn with the noise the target's draw there
will use: sampler.propose); each further draft feeds the head its own output and the
draft before, at the next position, in K/V slots lent for the step and given back at once
(they are overwritten by the extend pass once the real tokens are known).

Everything the pass writes is in this step's fresh slots or the lent ones, and the lent ones
go back whatever happens. A pass that raises costs its step's drafts only (Speculator.
model_drafts): the target's step stands, and the head's K/V at that step's positions stays
what the slots held, which later drafts read; verification keeps them out of the output.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence as Seq

import torch

from rvascend.engine import sampler
from rvascend.models.decoder import ForwardBatch, KVPool


class MtpRow:
    """One sequence's part of the extend pass."""

    def __init__(self, seq, start: int, kept: int, next_tokens: list[int], fresh: list[int], drafts: bool,
                 first_output: int = 0) -> None:
        self.seq = seq
        self.start = start              # its first row in the target batch
        self.kept = kept                # positions entering the head's K/V
        self.next_tokens = next_tokens  # the token after each of them
        self.fresh = fresh              # their slots (this step's)
        self.drafts = drafts            # it decodes next: draft for it
        self.first_output = first_output  # the output index its first draft stands for


def draft(model, pool: KVPool, target: ForwardBatch, rows: Seq[MtpRow], k: int, context_length: int,
          lend: Callable[[int], list[int]], give_back: Callable[[list[int]], None]) -> list[Optional[list[int]]]:
    """The extend pass over `rows`, then up to `k` drafts for each row that drafts (None
    for the others). `target` is the step's batch, its final hidden states kept."""
    if not rows:
        return []
    mtp, hidden = model.mtp, target.hidden
    ids, positions, hid, new_lens, prefix_lens, kv_slots, write = [], [], [], [], [], [], []
    for row in rows:
        ids.extend(row.next_tokens)
        positions.append(target.positions[row.start:row.start + row.kept])
        hid.append(hidden[row.start:row.start + row.kept])
        new_lens.append(row.kept)
        prefix_lens.append(len(row.seq.slots))
        kv_slots.append(row.seq.kv_slot_tensor(row.fresh))
        write.extend(row.fresh)
    last = torch.tensor(new_lens).cumsum(0) - 1
    batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.cat(positions), new_lens, prefix_lens, kv_slots,
                         torch.tensor(write, dtype=torch.long))
    h = mtp(model.model.embed_tokens(batch.input_ids), torch.cat(hid), model.rotary, batch, pool)
    drafting = [i for i, row in enumerate(rows) if row.drafts]
    out: list[Optional[list[int]]] = [None] * len(rows)
    if not drafting:
        return out
    h = h[last[drafting]]
    tokens = _proposals(model, h, [rows[i] for i in drafting], 0)
    for i, t in zip(drafting, tokens):
        out[i] = [t]
    # Further drafts, one position a pass, in lent slots.
    pos = [int(batch.positions[last[i]]) for i in drafting]
    steps = min(k, *(context_length - 2 - p for p in pos)) - 1 if k > 1 else 0
    lent = lend(steps * len(drafting)) if steps > 0 else []
    if len(lent) < steps * len(drafting):
        give_back(lent)
        return out
    try:
        for j in range(steps):
            seqs = [rows[i] for i in drafting]
            mine = [lent[n * steps:n * steps + j + 1] for n in range(len(drafting))]
            chain = ForwardBatch(torch.tensor([out[i][-1] for i in drafting], dtype=torch.long),
                                 torch.tensor([p + 1 + j for p in pos], dtype=torch.long),
                                 [1] * len(drafting), [len(r.seq.slots) + r.kept + j for r in seqs],
                                 [r.seq.kv_slot_tensor(r.fresh + m) for r, m in zip(seqs, mine)],
                                 torch.tensor([m[-1] for m in mine], dtype=torch.long))
            h = mtp(model.model.embed_tokens(chain.input_ids), h, model.rotary, chain, pool)
            for i, t in zip(drafting, _proposals(model, h, seqs, j + 1)):
                out[i].append(t)
    finally:
        give_back(lent)
    return out


def _proposals(model, h: torch.Tensor, rows: Seq[MtpRow], j: int) -> list[int]:
    """Each row's draft j from the head's outputs `h` (one per row)."""
    logits, ids = model.mtp.draft_logits(model.lm_head, h)
    return sampler.proposals(logits, [r.seq for r in rows], [r.first_output + j for r in rows], ids,
                             model.config.vocab_size)

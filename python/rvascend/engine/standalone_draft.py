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
slot, for both models). Drafts are the draft model's argmax: verification keeps the output
exactly the target's whatever they are.

Everything written is in this step's fresh slots or lent ones, so a failed step is
dropped as any other. Pages the hierarchical cache loads from host memory or disk are the
target's K/V only: the draft's pool has whatever those slots held, and its drafts there
are worse (never wrong).
"""

from __future__ import annotations

from typing import Callable

import torch
from absl import logging

from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool


class DraftModel:
    """A draft model and its K/V pool of `pool_slots` slots (the target's count)."""

    def __init__(self, model: CausalLM, target: CausalLM, pool_slots: int) -> None:
        config = model.config
        if config.linear_attention is not None:
            raise ValueError(f"the draft model ({config.architecture}) has recurrent layers: a STANDALONE draft "
                             "model must be attention-only (its states would have to follow every acceptance)")
        if config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({config.vocab_size} tokens) is not the target's "
                             f"({target.config.vocab_size}): a draft token must mean the same token")
        self.model = model
        self.max_positions = config.max_position_embeddings
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(config, pool_slots, dtype)
        logging.info("STANDALONE draft model: %s, %d layers, K/V pool of %d slots (%.1f MiB)", config.architecture,
                     config.num_hidden_layers, pool_slots, pool_slots * KVPool.bytes_per_token(config, dtype) / 2**20)

    def draft(self, rows, k: int, context_length: int, lend: Callable[[int], list[int]],
              give_back: Callable[[list[int]], None]) -> None:
        """Writes the step's kept positions into the draft's pool and sets each decoding row's
        `next_draft` (up to k tokens, as many as its draft budget asks next) for its next step.
        `rows`: the step's (model_runner) rows."""
        limit = min(context_length, self.max_positions)
        items = []  # (row, tokens, start, kept slots, the token drawn next or None, drafts wanted)
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
            # As many as the sequence's budget will ask for next (ngram_draft.DraftBudget), at most
            # k, none past the context's end.
            budget = seq.draft_budget
            want = 1 if budget is None else budget.after(row.drafts, len(row.sampled) - 1 if row.drafts else 0)
            want = max(0, min(want, k, limit - (start + len(tokens)))) if drawn is not None else 0
            if drawn is not None:
                row.next_draft = []  # whatever happens below, never the last step's draft again
            items.append([row, tokens, start, kept, drawn, want])
        if not items:
            return
        wanted = [i for i, item in enumerate(items) if item[5] > 0]
        lent = lend(sum(items[i][5] for i in wanted)) if wanted else []
        left = len(lent)  # too few free slots: the first rows draft, as many as there are
        for i in wanted:
            items[i][5] = min(items[i][5], left)
            left -= items[i][5]
        drafting = [i for i in wanted if items[i][5] > 0]
        try:
            self._run(items, drafting, lent)
        finally:
            give_back(lent)

    def _run(self, items, drafting: list[int], lent: list[int]) -> None:
        mine, at = {}, 0
        for i in drafting:
            mine[i], at = lent[at:at + items[i][5]], at + items[i][5]
        ids, positions, new_lens, prefix_lens, kv_slots, write, logit_rows = [], [], [], [], [], [], []
        for i, (row, tokens, start, kept, drawn, _) in enumerate(items):
            extra = [drawn] if i in mine else []  # only a drafting row runs the drawn token
            slots = kept + mine[i][:1] if i in mine else kept
            ids.extend(tokens + extra)
            positions.extend(range(start, start + len(tokens) + len(extra)))
            new_lens.append(len(tokens) + len(extra))
            prefix_lens.append(start)
            kv_slots.append(row.seq.kv_slot_tensor(slots))
            write.extend(slots)
            if extra:
                logit_rows.append(len(ids) - 1)
        batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                             new_lens, prefix_lens, kv_slots, torch.tensor(write, dtype=torch.long),
                             logit_rows=torch.tensor(logit_rows, dtype=torch.long))
        with torch.inference_mode():
            logits = self.model(batch, self.pool)
            if not drafting:
                return
            out: dict[int, list[int]] = {i: [t] for i, t in zip(drafting, logits.argmax(-1).tolist())}
            for j in range(1, max(items[i][5] for i in drafting)):  # draft j + 1, after draft j
                going = [i for i in drafting if items[i][5] > j]
                chain = ForwardBatch(
                    torch.tensor([out[i][-1] for i in going], dtype=torch.long),
                    torch.tensor([items[i][2] + len(items[i][1]) + j for i in going], dtype=torch.long),
                    [1] * len(going), [items[i][2] + len(items[i][1]) + j for i in going],
                    [items[i][0].seq.kv_slot_tensor(items[i][3] + mine[i][:j + 1]) for i in going],
                    torch.tensor([mine[i][j] for i in going], dtype=torch.long))
                for i, t in zip(going, self.model(chain, self.pool).argmax(-1).tolist()):
                    out[i].append(t)
        for i, tokens in out.items():
            items[i][0].next_draft = tokens


def check_tokenizers(target, draft, draft_path: str) -> None:
    """A draft model must tokenize as the target does (tokenizer/tokenizer.py's Tokenizers): the
    same vocabulary, added tokens included, and the same special tokens; refused otherwise.
    (Compared as data: a GGUF's tokenizer and the same one in a directory differ as text.)"""
    def what(tok):
        return (tok._tok.get_vocab(with_added_tokens=True), tok.bos_token, tok.eos_token)
    if what(target) != what(draft):
        raise ValueError(f"--speculative-draft-model-path {draft_path}: its tokenizer is not the target's (a draft "
                         "token id must be the same text in both models)")

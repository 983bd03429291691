"""The model side of a step: the KV pool and recurrent states, the batch of a step's
rows, the forward pass and every row's sampling (SGLang's ModelRunner).

It is the only engine module that touches `dispatch` (which kernel a call takes, and
the weights' generation, which retires the prefix cache when the weights change).
`prepare` and `run` change nothing a client or another step can see: the step's
commit (engine.py) does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Optional

import torch
from absl import logging

from rvascend import ops
from rvascend.dispatch import weights_generation
from rvascend.dispatch.kernel_routes import routes_of
from rvascend.dispatch.route import ROUTE_ID_BUFFER, SHAPE_BUFFER
from rvascend.ops import kernel_sets
from rvascend.engine import sampler
from rvascend.engine.grammar import GrammarBackend
from rvascend.engine.sequence import Sequence
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.state_pool import RecurrentStatePool


@dataclasses.dataclass
class Row:
    """What one sequence contributes to a step and gets back from it."""

    seq: Sequence
    new: int                      # tokens it runs this step
    prefill: bool                 # they are prompt tokens
    fresh: list[int]              # slots taken for them
    input_rows: list[int] = dataclasses.field(default_factory=list)  # logit rows of prompt log-probabilities
    sample_row: Optional[int] = None  # logit row its next token is sampled from
    drafts: int = 0               # draft tokens it verifies: rows sample_row .. sample_row + drafts
    snapshots: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (tokens, slot) states kept
    # Results, filled by run():
    input_logprobs: list = dataclasses.field(default_factory=list)
    sampled: list[sampler.Sampled] = dataclasses.field(default_factory=list)  # one, or the accepted run
    error: Optional[str] = None
    appended: int = 0             # of `sampled`, the tokens the commit appended (an end drops the rest)
    next_draft: Optional[list[int]] = None  # NEXTN, STANDALONE: the drafting model's draft for its next step
    draft_synced: Optional[int] = None  # STANDALONE: the draft's pool holds its positions before this


@dataclasses.dataclass
class Plan:
    rows: list[Row]
    batch: ForwardBatch


# Buffers that hold no weights: a route's id (numbered per process) and the zero-stride
# stand-in for a weight whose packed copy is the weight (the packed copy is hashed).
_NOT_WEIGHTS = frozenset({ROUTE_ID_BUFFER, SHAPE_BUFFER})


class ModelRunner:
    def __init__(self, model: CausalLM, pool_slots: int, state_slots: int, keep_hidden: bool) -> None:
        self.model = model
        dtype = next(model.parameters()).dtype
        mtp = getattr(model, "mtp", None)
        self.pool = KVPool(model.config, pool_slots, dtype, extra_layers=len(mtp.layers) if mtp is not None else 0)
        self.states: Optional[RecurrentStatePool] = None
        if model.config.linear_attention is not None:
            self.states = self.pool.states = RecurrentStatePool(model.config, state_slots, dtype)
            logging.info("recurrent states: %d slots of %.1f MiB", state_slots,
                         RecurrentStatePool.bytes_per_slot(model.config, dtype) / 2**20)
        self.keep_hidden = keep_hidden  # NEXTN: the MTP head reads the final hidden states
        self.last_batch_rows = 0
        self.last_pass_seconds = 0.0
        weights_generation.watch(model)

    def weights_generation(self) -> int:
        """Changes whenever the model's weights do (load_state_dict, repacking)."""
        return weights_generation.current(self.model)

    def fingerprint(self) -> str:
        """sha256 (hex) of everything on the model side that decides the bits of a K/V or a
        recurrent state: the weights' bytes, names and dtypes, the model's config, the kernel
        route and deterministic mode, the kernel sets this CPU runs, the threads and torch's
        version (the cache tiers' context: hierarchical_cache.py)."""
        routes = routes_of(self.model)
        h = hashlib.sha256(json.dumps({
            "config": repr(self.model.config), "kernel_sets": kernel_sets.available(),
            "routes": None if routes is None else [routes.enabled, routes.batch_invariant],
            "threads": torch.get_num_threads(), "torch": torch.__version__}, sort_keys=True).encode())
        # Parameters and buffers as they are, persistent or not (a kept-quantized file's blocks
        # and the packed copies are non-persistent buffers), one tensor at a time: state_dict()
        # would unpack every packed weight into a second copy of the model.
        tensors = [*self.model.named_parameters(remove_duplicate=False), *self.model.named_buffers(remove_duplicate=False)]
        for name, tensor in tensors:
            if tensor is None or name.rsplit(".", 1)[-1] in _NOT_WEIGHTS:
                continue
            h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            if tensor.numel():
                h.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        return h.hexdigest()

    def prepare(self, work: list[tuple[Sequence, int]], fresh: list[int],
                snapshots: Optional[list[list[tuple[int, int]]]] = None) -> Plan:
        """The batch of `work` (sequence, tokens it runs), its new tokens' K/V in `fresh`,
        and (hybrid models) per item the (tokens, slot) points its states are kept at."""
        rows, ids, positions, new_lens, prefix_lens, kv_slots, logit_rows = [], [], [], [], [], [], []
        offset = 0
        for i, (seq, n) in enumerate(work):
            prefill = seq.prefilling
            new = seq.prompt_ids[seq.prefilled:seq.prefilled + n] if prefill else [seq.last_token] + seq.draft[:n - 1]
            start = seq.prefilled if prefill else seq.num_tokens - 1
            row = Row(seq, len(new), prefill, fresh[:len(new)], snapshots=snapshots[i] if snapshots else [])
            del fresh[:len(new)]
            ids.extend(new)
            positions.extend(range(start, start + len(new)))
            new_lens.append(len(new))
            prefix_lens.append(start)
            kv_slots.append(seq.kv_slot_tensor(row.fresh))
            if prefill and seq.params.logprob_start_len >= 0:
                # Row p's logits give the log-probability of prompt token p + 1.
                first = max(start, seq.params.logprob_start_len - 1)
                last = min(start + len(new), len(seq.prompt_ids) - 1)
                row.input_rows = list(range(len(logit_rows), len(logit_rows) + max(0, last - first)))
                logit_rows.extend(offset + p - start for p in range(first, last))
            if not prefill:  # a decode row, and the drafts it verifies: every row's logits
                row.sample_row, row.drafts = len(logit_rows), len(new) - 1
                logit_rows.extend(range(offset, offset + len(new)))
            elif start + len(new) == len(seq.prompt_ids):
                row.sample_row = len(logit_rows)
                logit_rows.append(offset + len(new) - 1)
            offset += len(new)
            rows.append(row)
        write = [s for row in rows for s in row.fresh]
        hybrid = self.states is not None
        if len(ids) == len(rows) and logit_rows == list(range(len(ids))):
            logit_rows = None  # every sequence's one row: forward's default, without a gather
        batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                             new_lens, prefix_lens, kv_slots, torch.tensor(write, dtype=torch.long),
                             logit_rows=None if logit_rows is None else torch.tensor(logit_rows, dtype=torch.long),
                             state_slots=[r.seq.spare_state_slots[r.drafts] for r in rows] if hybrid else None,
                             state_read_slots=[r.seq.state_slot if r.seq.state_read_from is None
                                               else r.seq.state_read_from for r in rows] if hybrid else None,
                             state_token_slots=token_slots(rows) if hybrid else None, keep_hidden=self.keep_hidden)
        return Plan(rows, batch)

    def run(self, plan: Plan, grammars: Optional[GrammarBackend], eos_ids: set[int]) -> None:
        """The forward pass and every row's sampling, into the plan; nothing is committed.
        A sequence whose logits cannot be sampled gets an error of its own."""
        self.last_batch_rows = int(plan.batch.input_ids.shape[0])
        constrained = [r for r in plan.rows if r.sample_row is not None and r.seq.matcher is not None
                       and r.seq.grammar_active]
        masks = grammars.masks_later([(r.seq.matcher, r.seq.draft[:r.drafts]) for r in constrained]) \
            if constrained else None
        started = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(plan.batch, self.pool)
        self.last_pass_seconds = time.perf_counter() - started  # the measured costs' (draft_cost.py)
        allowed = dict(zip(map(id, constrained), masks.result())) if masks is not None else {}
        sampling = [r for r in plan.rows if r.sample_row is not None]
        sample_rows = [r.sample_row + i for r in sampling for i in range(r.drafts + 1)]
        fast = self.greedy_tokens([r.seq for r in sampling], logits if sample_rows == list(range(logits.shape[0]))
                                  else logits[sample_rows])
        eos = tuple(eos_ids)
        first = 0  # the row's first sample row in `fast`
        for row in sampling:
            seq = row.seq
            try:
                # Position by position, as decoding would draw them: the token of a drafted
                # position is drawn from the target's own distribution there (greedy: its
                # argmax), and the draft survives while they agree. The first disagreement
                # is kept as the target's token; so is the token after an all-accepted draft.
                # Each position draws with its own generator, drafts or not, so the output is
                # the one decoding alone draws, token for token.
                for i in range(row.drafts + 1):
                    if fast is not None:
                        if fast[first + i] < 0:
                            raise sampler.SamplingError("the model produced NaN logits for this sequence")
                        drawn = sampler.Sampled(fast[first + i])
                    else:
                        mask = allowed.get(id(row))
                        generator = None if seq.params.greedy else seq.generator_at(len(seq.output_ids) + i)
                        drawn = sampler.sample(logits[row.sample_row + i], seq.params, generator,
                                               seq.prompt_ids, seq.output_ids + [t.token for t in row.sampled], eos,
                                               None if mask is None else mask[i])
                    row.sampled.append(drawn)
                    if i == row.drafts or drawn.token != seq.draft[i]:
                        break
            except Exception as e:  # noqa: BLE001 - this sequence's logits, this sequence's failure
                row.error = str(e) if isinstance(e, sampler.SamplingError) else \
                    f"sampling failed: {type(e).__name__}: {e}"
            first += row.drafts + 1
        for row in plan.rows:
            if row.input_rows:
                row.input_logprobs = prompt_logprobs(row, logits)

    def greedy_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> Optional[list[int]]:
        """Every row's argmax in one kernel call when all rows are plain greedy and routed, else None."""
        routes = routes_of(self.model)
        if routes is None or not seqs or not all(sampler.plain_greedy(s.params, len(s.output_ids)) for s in seqs):
            return None
        if not routes.use("argmax", logits, rows=len(seqs)):
            return None
        return ops.elementwise.argmax(logits).tolist()


def token_slots(rows: list[Row]) -> Optional[list[int]]:
    """Per token of the batch, -1 or the slot the states after it are also left in: a verify
    row's token j < k in spare slot j (its last token's go to spare slot k), a prefill row's
    snapshot points inside the chunk in their own slots (one at the chunk's end needs none:
    the chunk's states are written to the sequence's slot). None when no token keeps any."""
    if not any(r.drafts or r.snapshots for r in rows):
        return None
    out: list[int] = []
    for r in rows:
        if r.drafts:
            out += r.seq.spare_state_slots[:r.drafts] + [-1]
            continue
        kept = [-1] * r.new
        start = r.seq.prefilled
        for p, slot in r.snapshots:
            if p < start + r.new:
                kept[p - start - 1] = slot
        out += kept
    return out


def prompt_logprobs(row: Row, logits: torch.Tensor) -> list[tuple[int, Optional[float], Optional[list]]]:
    """(token, logprob, top logprobs) of the prompt tokens `row`'s input rows predict;
    the prompt's first token, which nothing predicts, gets None."""
    seq = row.seq
    out: list[tuple[int, Optional[float], Optional[list]]] = []
    first_predicted = max(seq.prefilled, seq.params.logprob_start_len - 1) + 1
    if seq.prefilled == 0 and seq.params.logprob_start_len == 0:
        out.append((seq.prompt_ids[0], None, None))
    k = seq.params.logprobs or 0
    for i, r in enumerate(row.input_rows):
        token = seq.prompt_ids[first_predicted + i]
        lp = sampler.log_softmax(logits[r].float())
        top = None
        if k:
            values, ids = lp.topk(k)
            top = [(int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist())]
        out.append((token, float(lp[token]), top))
    return out

"""The engine: FCFS admission against the KV pool, prefill and batched decode steps.

Each step runs one forward pass over every running sequence: one decode token
for each sequence that is decoding (two make M = 2 in every projection) plus
the prompt tokens of the sequences still prefilling, at most
`chunked_prefill_size` of them per step (a long prompt is prefilled over
several steps). So a long prompt delays the others' next token by one chunk,
not by its whole prefill. KV memory is reserved at admission for prompt +
max_tokens, so a running request never runs out of slots; requests wait until
their reservation fits.

A step is a transaction, as SGLang's ScheduleBatch -> forward ->
process_batch_result: `_prepare` takes the new tokens' slots and builds the
batch, `_run` computes the logits and samples, and only `_commit` changes what
anyone can observe (sequences' slots and tokens, outputs, the prefix cache).
A failure before commit gives the slots back and leaves every sequence,
reservation and cache lock exactly as it was, so the step can be retried one
sequence at a time and fail only the sequence that makes it fail.

The prefix cache (prefix_cache.py) keeps the K/V of finished and fully
prefilled prompts; a new request starts prefilling after the longest cached
prefix of its prompt. Cached slots nobody uses are evicted when the free list
runs dry. The reservation stays prompt + max_tokens, cached part included: every
slot a running request refers to is counted in its own reservation, so shared
slots never overcommit the pool (sharing saves compute and time to first token,
not admission room). When the model's weights change (load_state_dict,
invalidate_packed_weights, repack) the cache is retired before the next step.

A hybrid model (Qwen3.5) also keeps a recurrent state per sequence: two slots
of the RecurrentStatePool (models/state_pool.py) taken at admission and given
back at the end, whatever the end. A step reads a sequence's state from one and
writes the other, and `_commit` swaps them, so `_abandon` has nothing to put
back (an undo copy of the states, 18 MB a sequence for Qwen3.5-0.8B, cost more
than a tenth of an x86 decode step). With speculative decoding a sequence holds
2 + K slots: a verify step of 1 + k tokens leaves the states after each token in
a slot of its own (the delta-rule op's per-token state slots), and `_commit`
keeps the one after the last accepted token. Nothing is recomputed or copied to
roll back the rejected drafts. The prefix
cache is off for such models: a cached prefix's K/V are of no use without the
recurrent state at the same token, and keeping state snapshots per cache node
(SGLang's Mamba radix cache) is left for later.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable, Optional

import torch
from absl import logging

from rvascend import ops
from rvascend.engine import sampler
from rvascend.engine.grammar import Grammar, GrammarBackend, GrammarError
from rvascend.engine import mtp_draft
from rvascend.engine.ngram_draft import DraftBudget, NgramIndex
from rvascend.tokenizer.detokenizer import IncrementalDetokenizer
from rvascend.engine.prefix_cache import PrefixCache, common_prefix_len
from rvascend.engine.request_validation import RequestError, validate_request
from rvascend.engine.sequence import Output, SamplingParams, Sequence, Status
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.state_pool import RecurrentStatePool
from rvascend.dispatch import weights_generation
from rvascend.dispatch.kernel_routes import routes_of

__all__ = ["Engine", "EngineConfig", "QueueFullError", "RequestError"]

# Shared uncached prompt tokens that make a request wait for another one's prefill.
SHARED_PREFILL_WAIT = 32


class QueueFullError(RuntimeError):
    """Too many requests queued or running; retry later."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    max_running_requests: int = 8
    max_total_tokens: int = 8192       # KV pool slots
    max_prefill_tokens: int = 4096     # prompt tokens of the requests admitted together (prefill: chunked_prefill_size)
    max_queued_requests: int = 64      # waiting + running, beyond it: QueueFullError
    context_length: Optional[int] = None  # default: the model's max_position_embeddings
    chunked_prefill_size: Optional[int] = 512  # prompt tokens per prefill step; None or <= 0: whole prompts
    disable_radix_cache: bool = False  # True: no prefix cache, every prompt is prefilled whole
    # Speculative decoding (SGLang's flags): "NGRAM" drafts up to num_draft_tokens tokens per
    # sequence from its own prompt and output (engine/ngram_draft.py), "NEXTN" with the
    # model's MTP head (engine/mtp_draft.py; Qwen3.5 loaded with it); None: off.
    speculative_algorithm: Optional[str] = None
    speculative_num_draft_tokens: int = 4
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 8


@dataclasses.dataclass
class _Row:
    """What one sequence contributes to a step and gets back from it."""

    seq: Sequence
    new: int                      # tokens it runs this step
    prefill: bool                 # they are prompt tokens
    fresh: list[int]              # slots taken for them
    input_rows: list[int] = dataclasses.field(default_factory=list)  # logit rows of prompt log-probabilities
    sample_row: Optional[int] = None  # logit row its next token is sampled from
    drafts: int = 0               # draft tokens it verifies: rows sample_row .. sample_row + drafts
    # Results, filled by _run:
    input_logprobs: list = dataclasses.field(default_factory=list)
    sampled: list[sampler.Sampled] = dataclasses.field(default_factory=list)  # one, or the accepted run
    error: Optional[str] = None
    appended: int = 0             # of `sampled`, the tokens _commit appended (an end drops the rest)
    next_draft: Optional[list[int]] = None  # NEXTN: the MTP head's draft for its next step


@dataclasses.dataclass
class _Plan:
    rows: list[_Row]
    batch: ForwardBatch
    generator_states: list[tuple[torch.Generator, torch.Tensor]]


class Engine:
    def __init__(self, model: CausalLM, tokenizer: Optional[Tokenizer], config: EngineConfig = EngineConfig()) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.context_length = min(config.context_length or model.config.max_position_embeddings,
                                  model.config.max_position_embeddings)
        dtype = next(model.parameters()).dtype
        mtp = getattr(model, "mtp", None)
        self.pool = KVPool(model.config, config.max_total_tokens, dtype,
                           extra_layers=len(mtp.layers) if mtp is not None else 0)
        self._free_slots = list(range(config.max_total_tokens - 1, -1, -1))
        self.states: Optional[RecurrentStatePool] = None
        self._free_states: list[int] = []
        # Per sequence: the slot read, and one written per token a step keeps the states after.
        self._state_slots_each = 2 + (config.speculative_num_draft_tokens if config.speculative_algorithm else 0)
        if model.config.linear_attention is not None:
            slots = self._state_slots_each * config.max_running_requests
            self.states = self.pool.states = RecurrentStatePool(model.config, slots, dtype)
            self._free_states = list(range(slots - 1, -1, -1))
            logging.info("recurrent states: %d slots of %.1f MiB (%d per running request)", slots,
                         RecurrentStatePool.bytes_per_slot(model.config, dtype) / 2**20, self._state_slots_each)
        hybrid_without_cache = self.states is not None and not config.disable_radix_cache
        if hybrid_without_cache:
            logging.info("prefix cache off: %s has linear-attention layers, whose recurrent state a cached "
                         "prefix's K/V cannot restore", model.config.architecture)
        self.cache = None if config.disable_radix_cache or hybrid_without_cache else \
            PrefixCache(config.max_total_tokens)
        weights_generation.watch(model)
        self._weights_generation = weights_generation.current(model)
        self._reserved = 0
        self._lock = threading.Lock()
        # One step at a time: a step owns the pool, the batch and the running list
        # from admission to commit, and `generate` may be called beside the server's
        # engine thread (which steps whenever there is work).
        self._step_lock = threading.Lock()
        self._pending: collections.deque[Sequence] = collections.deque()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._running: list[Sequence] = []
        self.eos_ids = set(model.config.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self.last_batch_rows = 0
        self._grammars: Optional[GrammarBackend] = None  # made at the first constrained request
        if config.speculative_algorithm not in (None, "NGRAM", "NEXTN"):
            raise ValueError(f"--speculative-algorithm {config.speculative_algorithm!r} is not supported "
                             "(NGRAM, NEXTN)")
        if config.speculative_algorithm == "NEXTN" and mtp is None:
            raise ValueError(f"--speculative-algorithm NEXTN drafts with the checkpoint's MTP head, and this "
                             f"{model.config.architecture} model was loaded without one (load_model(..., mtp=True))")
        if config.speculative_algorithm is not None and not 1 <= config.speculative_num_draft_tokens <= 16:
            raise ValueError("--speculative-num-draft-tokens must be 1 to 16")
        if not 1 <= config.speculative_ngram_min_match_window_size <= config.speculative_ngram_max_match_window_size:
            raise ValueError("the n-gram match windows need 1 <= min <= max")
        self.spec_drafted = self.spec_accepted = 0  # draft tokens verified, and accepted
        # Verify steps by (drafts, accepted) per sequence: the acceptance-length distribution.
        self.spec_outcomes: collections.Counter[tuple[int, int]] = collections.Counter()
        self.step_started: Optional[float] = None  # time.monotonic() of the step under way
        self.wakeup = threading.Condition()

    # -- requests (any thread) ---------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        validate_request(prompt_ids, params, self.model.config.vocab_size, self.context_length,
                         self.config.max_total_tokens)
        if params.grammar is not None and getattr(self.tokenizer, "tokenizer_json", None) is None:
            raise RequestError("a grammar (response_format, json_schema, regex, ebnf) needs the model's tokenizer")

    def compile_grammar(self, grammar: Grammar):
        """A matcher at the start of `grammar` (RequestError naming what is wrong with it).
        Compiling can take a while for a large schema: the server calls this off its event
        loop first, and add_request then finds the grammar compiled."""
        with self._lock:
            if self._grammars is None:
                self._grammars = GrammarBackend(self.tokenizer.tokenizer_json, self.model.config.vocab_size,
                                                sorted(self.eos_ids))
        try:
            return self._grammars.compile(grammar)
        except GrammarError as e:
            raise RequestError(str(e)) from None

    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    on_output: Optional[Callable[[Sequence, Output], None]] = None) -> Sequence:
        self.validate(prompt_ids, params)
        seq = Sequence(prompt_ids, params, on_output)
        if params.grammar is not None:
            seq.matcher = self.compile_grammar(params.grammar)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.skip_special_tokens)
        with self._lock:
            if len(self._pending) + len(self._waiting) + len(self._running) >= self.config.max_queued_requests:
                raise QueueFullError(f"{self.config.max_queued_requests} requests are already queued or running")
            self._pending.append(seq)
        with self.wakeup:
            self.wakeup.notify()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Stops a request (e.g. its client went away); its KV slots are freed at the next step."""
        seq.aborted = True
        with self.wakeup:
            self.wakeup.notify()

    # -- introspection ---------------------------------------------------------
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._pending or self._waiting or self._running)

    def stats(self) -> dict[str, float]:
        """kv_used_tokens: slots requests hold (free slots and evictable cache excluded);
        kv_cached_tokens: slots the prefix cache holds (shared with requests or evictable);
        kv_locked_tokens: of those, pinned by running requests; state_slots_free /
        state_slots_total: recurrent-state slots (hybrid models; 0 otherwise);
        cache_retirements: times the cache was emptied because the weights changed;
        spec_drafted_tokens / spec_accepted_tokens: draft tokens verified, and accepted."""
        with self._lock:
            cache = self.cache
            evictable = cache.evictable_size if cache else 0
            return {"running": len(self._running), "waiting": len(self._waiting) + len(self._pending),
                    "kv_used_tokens": self.config.max_total_tokens - len(self._free_slots) - evictable,
                    "kv_cached_tokens": cache.size if cache else 0,
                    "kv_locked_tokens": cache.locked_size if cache else 0,
                    "state_slots_free": len(self._free_states),
                    "state_slots_total": self.states.num_slots if self.states is not None else 0,
                    "kv_reserved_tokens": self._reserved, "kv_total_tokens": self.config.max_total_tokens,
                    "cache_hit_rate": cache.hit_rate if cache else 0.0,
                    "cache_retirements": cache.retirements if cache else 0,
                    "spec_drafted_tokens": self.spec_drafted, "spec_accepted_tokens": self.spec_accepted}

    @property
    def states_free(self) -> int:
        """Requests' worth of recurrent-state slots no request holds (hybrid models)."""
        with self._lock:
            return len(self._free_states) // self._state_slots_each

    def flush_cache(self) -> bool:
        """Empties the prefix cache; refused (False) while requests are queued or running,
        or while a step is under way (the requests it admits are in no queue meanwhile).
        Never waits for a step: the server calls it from its event loop."""
        if not self._step_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if self.cache is None:
                    return True
                if self._pending or self._waiting or self._running:
                    return False
                freed = self.cache.flush()
                if freed is None:
                    return False
                self._free_slots.extend(freed)
                return True
        finally:
            self._step_lock.release()

    # -- the step (one thread at a time) ----------------------------------------
    def step(self) -> int:
        """Runs one forward pass if there is work; returns the number of sequences it
        advanced. Steps from several threads run one after another."""
        with self._step_lock:
            return self._step()

    def _step(self) -> int:
        with self._lock:
            self._waiting.extend(self._pending)
            self._pending.clear()
            self._retire_stale_cache()
        self._drop_aborted()
        admitted = self._admit()
        with self._lock:
            # Running from admission on, so that a failing step fails them too.
            self._running.extend(admitted)
            decoding = [s for s in self._running if not s.prefilling]
            prefilling = [s for s in self._running if s.prefilling]
        if not decoding and not prefilling:
            return 0
        work = [(s, 1 + len(self._draft(s))) for s in decoding] + self._prefill_chunk(prefilling)
        self.step_started = time.monotonic()
        try:
            self._guarded_step(work)
        finally:
            self.step_started = None
        return len(work)

    def _draft(self, seq: Sequence) -> list[int]:
        """The tokens `seq` drafts for this step (speculative decoding; engine/ngram_draft.py,
        engine/mtp_draft.py): none when speculation is off, before its grammar applies, or where
        its drafts have been doing badly; under a grammar, only the draft's prefix the grammar
        allows."""
        config = self.config
        seq.draft = []
        if config.speculative_algorithm is None or (seq.matcher is not None and not seq.grammar_active):
            return seq.draft
        if seq.draft_budget is None:
            seq.draft_budget = DraftBudget(config.speculative_num_draft_tokens)
            if config.speculative_algorithm == "NGRAM":
                seq.ngram = NgramIndex(config.speculative_ngram_min_match_window_size,
                                       config.speculative_ngram_max_match_window_size)
        # Never past max_tokens or the context: the drafts' K/V slots come out of the reservation.
        room = min(seq.params.max_tokens - len(seq.output_ids), self.context_length - seq.num_tokens) - 1
        k = min(seq.draft_budget.next_k(), room)
        if k > 0:
            seq.draft = seq.mtp_draft[:k] if config.speculative_algorithm == "NEXTN" else \
                seq.ngram.propose(seq.prompt_ids, seq.output_ids, k)
            if seq.matcher is not None and seq.draft:
                # Nothing follows an EOS under a grammar, and the matcher never takes a drafted
                # EOS (GrammarBackend._draft_masks): the draft ends at its first one.
                end = next((i + 1 for i, t in enumerate(seq.draft) if t in self.eos_ids), len(seq.draft))
                seq.draft = seq.draft[:seq.matcher.validate_tokens(seq.draft[:end])]
        return seq.draft

    def _take_state_slots(self, seq: Sequence) -> None:
        """A hybrid model's sequence's recurrent-state slots, from admission to release (caller
        holds the lock and has checked there are enough)."""
        if self.states is not None:
            seq.state_slot = self._free_states.pop()
            seq.spare_state_slots = [self._free_states.pop() for _ in range(self._state_slots_each - 1)]

    def _retire_stale_cache(self) -> None:
        """Drops cached K/V computed with weights that have changed since (caller holds the lock)."""
        generation = weights_generation.current(self.model)
        if generation == self._weights_generation:
            return
        self._weights_generation = generation
        if self.cache is not None:
            self._free_slots.extend(self.cache.retire())
            logging.info("the model's weights changed: the prefix cache was emptied")

    def _prefill_chunk(self, prefilling: list[Sequence]) -> list[tuple[Sequence, int]]:
        """(sequence, prompt tokens to prefill now), in arrival order, within the chunk size."""
        budget = self.config.chunked_prefill_size
        if budget is None or budget <= 0:
            return [(s, len(s.prompt_ids) - s.prefilled) for s in prefilling]
        work = []
        for seq in prefilling:
            n = min(len(seq.prompt_ids) - seq.prefilled, budget)
            work.append((seq, n))
            budget -= n
            if budget == 0:
                break
        return work

    def _guarded_step(self, work: list[tuple[Sequence, int]]) -> None:
        """A failing step fails exactly the sequences that make it fail: nothing of it
        was committed, so a step of several sequences that raises is run again one
        sequence at a time, and one poisoned request in a mixed prefill/decode step
        does not take the running ones with it."""
        plan = None
        try:
            plan = self._prepare(work)
            self._run(plan)
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            if plan is not None:
                self._abandon(plan)
            if len(work) > 1:
                logging.warning("an engine step of %d sequences failed (%s: %s); running them one at a time",
                                len(work), type(e).__name__, e)
                for seq, n in work:
                    if seq.status is Status.RUNNING and seq in self._running:
                        self._guarded_step([(seq, n)])
                return
            logging.exception("engine step failed; failing its sequence")
            with self._lock:
                for seq, _ in work:
                    if seq in self._running:
                        self._running.remove(seq)
                    self._fail(seq, f"the engine step failed: {type(e).__name__}: {e}")
            return
        self._commit(plan)

    # -- admission -----------------------------------------------------------------
    def _admit(self) -> list[Sequence]:
        """Admits waiting requests in arrival order while their reservations fit. A
        request that shares a prefill under way steps aside (it will hit the cache
        once that prefill is done) without holding up the requests behind it."""
        admitted: list[Sequence] = []
        deferred: list[Sequence] = []
        tokens = 0
        with self._lock:
            while self._waiting and len(self._running) + len(admitted) < self.config.max_running_requests:
                seq = self._waiting[0]
                if self._shares_a_prefill_under_way(seq, admitted):
                    deferred.append(self._waiting.popleft())
                    continue
                if self._reserved + seq.reservation > self.config.max_total_tokens:
                    break  # FCFS: the head waits for memory, nobody overtakes it
                if self.states is not None and len(self._free_states) < self._state_slots_each:
                    break  # every slot held (unreachable while running requests <= max_running_requests)
                if admitted and tokens + len(seq.prompt_ids) > self.config.max_prefill_tokens:
                    break
                self._waiting.popleft()
                seq.reserved = seq.reservation
                self._reserved += seq.reserved
                tokens += len(seq.prompt_ids)
                seq.status = Status.RUNNING
                seq.weights_generation = self._weights_generation
                self._take_state_slots(seq)
                self._reuse_cached_prefix(seq)
                admitted.append(seq)
            self._waiting.extendleft(reversed(deferred))
        return admitted

    def _shares_a_prefill_under_way(self, seq: Sequence, admitted: list[Sequence]) -> bool:
        """Whether a request being prefilled is computing at least SHARED_PREFILL_WAIT
        prompt tokens `seq` starts with (caller holds the lock). Then `seq` waits for it
        (SGLang's in-batch prefix caching): prefilling the same tokens twice would only
        slow both down, and once they are cached `seq` prefills only its own rest."""
        if self.cache is None:
            return False
        for other in [*self._running, *admitted]:
            if other.prefilling:
                shared = common_prefix_len(other.prompt_ids, seq.prompt_ids[:_cacheable(seq)])
                if shared >= other.cached_tokens + SHARED_PREFILL_WAIT:
                    return True
        return False

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Starts `seq` after the longest cached prefix of its prompt (caller holds the lock)."""
        if self.cache is None:
            return
        slots, node = self.cache.match(seq.prompt_ids[:_cacheable(seq)])
        self.cache.lock(node)
        seq.cache_node = node
        seq.slots = list(slots)
        seq.prefilled = seq.cached_tokens = len(slots)
        self.cache.hit_tokens += len(slots)
        self.cache.queried_tokens += len(seq.prompt_ids)

    # -- one step: prepare, run, commit -------------------------------------------
    def _prepare(self, work: list[tuple[Sequence, int]]) -> _Plan:
        """The batch of `work`, with fresh slots for its new tokens; changes nothing
        else (`_abandon` gives the slots back)."""
        with self._lock:
            fresh = self._take_slots(sum(n for _, n in work))
        rows, ids, positions, new_lens, prefix_lens, kv_slots, logit_rows = [], [], [], [], [], [], []
        offset = 0
        for seq, n in work:
            prefill = seq.prefilling
            new = seq.prompt_ids[seq.prefilled:seq.prefilled + n] if prefill else [seq.last_token] + seq.draft[:n - 1]
            start = seq.prefilled if prefill else seq.num_tokens - 1
            row = _Row(seq, len(new), prefill, fresh[:len(new)])
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
        # A verify row's token j < k leaves its states in spare slot j, its last token in spare slot k.
        token_slots = [s for r in rows for s in (r.seq.spare_state_slots[:r.drafts] + [-1] if r.drafts else
                                                 [-1] * r.new)] if hybrid and any(r.drafts for r in rows) else None
        batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                             new_lens, prefix_lens, kv_slots, torch.tensor(write, dtype=torch.long),
                             logit_rows=None if logit_rows is None else torch.tensor(logit_rows, dtype=torch.long),
                             state_slots=[r.seq.spare_state_slots[r.drafts] for r in rows] if hybrid else None,
                             state_read_slots=[r.seq.state_slot for r in rows] if hybrid else None,
                             state_token_slots=token_slots,
                             keep_hidden=self.config.speculative_algorithm == "NEXTN")
        states = [(r.seq.generator, r.seq.generator.get_state()) for r in rows if r.seq.generator is not None]
        return _Plan(rows, batch, states)

    def _abandon(self, plan: _Plan) -> None:
        """Undoes `_prepare` (and whatever `_run` drew from the sequences' generators)."""
        with self._lock:
            for row in plan.rows:
                self._free_slots.extend(reversed(row.fresh))
        for generator, state in plan.generator_states:
            generator.set_state(state)

    def _run(self, plan: _Plan) -> None:
        """The forward pass and every row's sampling, into the plan; nothing is committed.
        A sequence whose logits cannot be sampled gets an error of its own."""
        self.last_batch_rows = int(plan.batch.input_ids.shape[0])
        constrained = [r for r in plan.rows if r.sample_row is not None and r.seq.matcher is not None
                       and r.seq.grammar_active]
        masks = self._grammars.masks_later([(r.seq.matcher, r.seq.draft[:r.drafts]) for r in constrained]) \
            if constrained else None
        with torch.inference_mode():
            logits = self.model(plan.batch, self.pool)
        allowed = dict(zip(map(id, constrained), masks.result())) if masks is not None else {}
        sampling = [r for r in plan.rows if r.sample_row is not None]
        sample_rows = [r.sample_row + i for r in sampling for i in range(r.drafts + 1)]
        fast = self._greedy_tokens([r.seq for r in sampling], logits if sample_rows == list(range(logits.shape[0]))
                                   else logits[sample_rows])
        eos = tuple(self.eos_ids)
        first = 0  # the row's first sample row in `fast`
        for row in sampling:
            seq = row.seq
            try:
                # Position by position, as decoding would draw them: the token of a drafted
                # position is drawn from the target's own distribution there (greedy: its
                # argmax), and the draft survives while they agree. The first disagreement
                # is kept as the target's token; so is the token after an all-accepted draft.
                # Drafts are one token each, so this is exact rejection sampling: the output
                # is distributed as without drafts, and a seeded generator draws the same.
                for i in range(row.drafts + 1):
                    if fast is not None:
                        if fast[first + i] < 0:
                            raise sampler.SamplingError("the model produced NaN logits for this sequence")
                        drawn = sampler.Sampled(fast[first + i])
                    else:
                        mask = allowed.get(id(row))
                        drawn = sampler.sample(logits[row.sample_row + i], seq.params, seq.generator,
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
                row.input_logprobs = _prompt_logprobs(row, logits)
        if self.config.speculative_algorithm == "NEXTN":
            self._mtp_drafts(plan)

    def _mtp_drafts(self, plan: _Plan) -> None:
        """The MTP head's extend pass over this step's kept positions and its drafts for the
        sequences' next steps (engine/mtp_draft.py), into the rows; nothing is committed."""
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
                mtp_rows.append(mtp_draft.MtpRow(seq, first, row.new, after, row.fresh, row.sample_row is not None))
            else:  # the input token and the accepted drafts; the next tokens are what was drawn
                kept = len(row.sampled)
                mtp_rows.append(mtp_draft.MtpRow(seq, first, kept, [s.token for s in row.sampled], row.fresh[:kept],
                                                 True))
            rows.append(row)

        def lend(n: int) -> list[int]:
            with self._lock:
                n = min(n, len(self._free_slots))
                taken = self._free_slots[len(self._free_slots) - n:]
                del self._free_slots[len(self._free_slots) - n:]
            return taken

        def give_back(slots: list[int]) -> None:
            with self._lock:
                self._free_slots.extend(slots)

        with torch.inference_mode():
            drafts = mtp_draft.draft(self.model, self.pool, plan.batch, mtp_rows,
                                     self.config.speculative_num_draft_tokens, self.context_length, lend, give_back)
        for row, d in zip(rows, drafts):
            row.next_draft = d

    def _greedy_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> Optional[list[int]]:
        """Every row's argmax in one kernel call when all rows are plain greedy and routed, else None."""
        routes = routes_of(self.model)
        if routes is None or not seqs or not all(sampler.plain_greedy(s.params, len(s.output_ids)) for s in seqs):
            return None
        if not routes.use("argmax", logits, rows=len(seqs)):
            return None
        return ops.elementwise.argmax(logits).tolist()

    def _commit(self, plan: _Plan) -> None:
        """Applies a step that ran: tokens, outputs, slots, prompt progress, the cache.
        A sequence whose own commit fails (its client's callback, its detokenizer, its
        cache insertion) is failed alone and gives back what it holds."""
        now = time.perf_counter()
        failed: dict[int, Exception] = {}
        # Tokens first: an end inside a verified run (EOS, a stop token or string, max_tokens)
        # decides how many of the run's K/V the sequence keeps.
        for row in plan.rows:
            if row.sample_row is None:
                continue
            try:
                if row.error is not None:
                    raise sampler.SamplingError(row.error)
                for sampled in row.sampled:  # one token, or a verified run: each as decoding emits it
                    self._append(row.seq, sampled, now)
                    row.appended += 1
                    if row.seq.finish_reason is not None:
                        break  # the rest of the run is dropped, with its K/V
            except Exception as e:  # noqa: BLE001 - fails this sequence only
                if not isinstance(e, sampler.SamplingError):
                    logging.exception("committing a token of sequence %d failed", row.seq.id)
                failed[id(row)] = e
        with self._lock:
            for row in plan.rows:
                # A decode row keeps the K/V of its input token and of each accepted draft
                # it appended after it (one per token appended); the rest go back now, so a
                # sequence never holds a slot past its tokens.
                kept = len(row.fresh) if row.prefill else max(1, row.appended)
                row.seq.slots.extend(row.fresh[:kept])
                self._free_slots.extend(reversed(row.fresh[kept:]))
                if row.drafts:
                    accepted = len(row.sampled) - 1 if row.error is None else 0
                    row.seq.draft_budget.record(row.drafts, accepted)
                    self.spec_drafted += row.drafts
                    self.spec_accepted += accepted
                    self.spec_outcomes[(row.drafts, accepted)] += 1
                if row.next_draft is not None:
                    row.seq.mtp_draft = row.next_draft
                if self.states is not None:  # the states after its last kept token are in a spare slot
                    seq, newest = row.seq, row.seq.spare_state_slots[kept - 1 if row.drafts else 0]
                    seq.spare_state_slots = [s for s in seq.spare_state_slots if s != newest] + [seq.state_slot]
                    seq.state_slot = newest
                if row.prefill:
                    row.seq.prefilled += row.new
                row.seq.input_logprobs.extend(row.input_logprobs)
            for row in plan.rows:
                seq = row.seq
                error = failed.get(id(row))
                if error is not None:
                    if seq in self._running:
                        self._running.remove(seq)
                    if seq.status is not Status.FINISHED:
                        self._fail(seq, str(error) if isinstance(error, sampler.SamplingError)
                                   else f"{type(error).__name__}: {error}")
                    # Finished by its last token before the callback raised: what it
                    # holds goes back all the same.
                    self._release(seq)
                elif seq.finish_reason is not None:
                    if seq in self._running:
                        self._running.remove(seq)
                    self._release(seq)
                elif row.prefill and row.sample_row is not None and self.cache is not None \
                        and seq.status is Status.RUNNING and seq in self._running:
                    # The prompt just prefilled serves the requests admitted next.
                    self._cache_or_fail(seq)

    # -- tokens and endings -------------------------------------------------------
    def _append(self, seq: Sequence, sampled: sampler.Sampled, now: float) -> None:
        """One new token of `seq`: its grammar, its output, its timing, its text."""
        token = sampled.token
        if seq.matcher is not None and seq.grammar_active and not seq.matcher.consume_token(token):
            # The matcher's own message dumps its parser state and the grammar: for the log only.
            logging.warning("sequence %d: the grammar refused token %d: %s", seq.id, token, seq.matcher.get_error())
            raise sampler.SamplingError(f"the grammar refused token {token}")
        seq.output_ids.append(token)
        after = seq.params.grammar_after
        if not seq.grammar_active and tuple(seq.output_ids[-len(after):]) == after:
            seq.grammar_active = True
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.token_times.append(now)
        self._emit(seq, sampled)

    def _emit(self, seq: Sequence, sampled: sampler.Sampled) -> None:
        params = seq.params
        token = sampled.token
        reason, matched = None, None
        if not params.ignore_eos and token in self.eos_ids:
            reason, matched = "stop", token
        elif token in params.stop_token_ids:
            reason, matched = "stop", token
        elif len(seq.output_ids) >= params.max_tokens:
            reason = "length"
        if seq.detokenizer is not None:
            before = len(seq.text)
            if matched is None:  # the matched EOS / stop token's text is not output
                seq.text += seq.detokenizer.add(token)
            if reason:
                seq.text += seq.detokenizer.flush()
            if params.stop and len(seq.text) > before:
                # Only the new text and the longest stop's reach before it can hold a new match.
                start = max(0, before - max(len(s) for s in params.stop) + 1)
                hits = [(h, s) for h, s in ((seq.text.find(s, start), s) for s in params.stop if s) if h >= 0]
                if hits:
                    cut, matched = min(hits)
                    seq.text = seq.text[:cut]
                    reason = "stop"
        # Hold back text that may still become a stop string.
        hold = 0 if reason else max((len(s) for s in params.stop), default=1) - 1
        safe = len(seq.text) - hold
        delta = seq.text[seq.emitted:max(seq.emitted, safe)]
        seq.emitted += len(delta)
        seq.finish_reason = reason
        if reason:
            seq.status = Status.FINISHED
        if seq.on_output is not None:
            seq.on_output(seq, Output(delta, token, reason is not None, reason, sampled.logprob,
                                      sampled.top_logprobs, matched_stop=matched))

    def _fail(self, seq: Sequence, message: str) -> None:
        """Ends a sequence with an error the client sees (caller holds the lock)."""
        seq.error = message
        self._finish(seq, "error", message)

    def _finish(self, seq: Sequence, reason: str, error: Optional[str] = None) -> None:
        seq.finish_reason = reason
        self._release(seq)
        seq.status = Status.FINISHED
        if seq.on_output is not None:
            try:
                seq.on_output(seq, Output("", None, True, reason, error=error))
            except Exception:  # noqa: BLE001 - the client is gone; the engine goes on
                logging.exception("the output callback of sequence %d failed", seq.id)

    def _drop_aborted(self) -> None:
        with self._lock:
            for seq in [s for s in self._waiting if s.aborted]:
                self._waiting.remove(seq)
                self._finish(seq, "abort")
            for seq in [s for s in self._running if s.aborted]:
                self._running.remove(seq)
                self._finish(seq, "abort")

    # -- slots and the prefix cache (caller holds the lock) ---------------------------
    def _take_slots(self, n: int) -> list[int]:
        """n free slots, evicting unused cached prefixes if the free list is short."""
        if len(self._free_slots) < n and self.cache is not None:
            self._free_slots.extend(self.cache.evict(n - len(self._free_slots)))
        if len(self._free_slots) < n:  # the reservations make this unreachable
            raise RuntimeError(f"the KV pool has {len(self._free_slots)} free slots, {n} needed")
        taken = self._free_slots[len(self._free_slots) - n:]
        del self._free_slots[len(self._free_slots) - n:]
        taken.reverse()
        return taken

    def _cache_tokens(self, seq: Sequence) -> None:
        """Gives the K/V `seq` has written to the prefix cache and moves its lock to
        their end. Where the tree had the same tokens already, `seq` switches to the
        tree's slots and frees its own copies. K/V of weights that have changed
        since the sequence was admitted are never cached."""
        if seq.weights_generation != self._weights_generation:
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:len(seq.slots)]
        node, tree_slots = self.cache.insert(tokens, seq.slots)
        self._free_slots.extend(s for s, t in zip(seq.slots, tree_slots) if s != t)
        seq.slots = tree_slots
        self.cache.lock(node)
        if seq.cache_node is not None:
            self.cache.unlock(seq.cache_node)
        seq.cache_node = node

    def _cache_or_fail(self, seq: Sequence) -> None:
        """Caches the prompt `seq` has prefilled; if that fails, `seq` alone fails and gives
        back what it holds (caller holds the lock)."""
        try:
            self._cache_tokens(seq)
        except Exception as e:  # noqa: BLE001 - this sequence's failure, not the step's
            logging.exception("caching the prompt of sequence %d failed", seq.id)
            self._running.remove(seq)
            self._fail(seq, f"caching its prompt failed: {type(e).__name__}: {e}")

    def _release(self, seq: Sequence) -> None:
        """Returns whatever a sequence holds: slots, reservation, prefix-cache lock,
        recurrent-state slots. Idempotent, and decided on what is held, not on the
        sequence's status, so every way a sequence ends can call it. Its K/V go to the
        prefix cache unless it failed (nothing of a request that errored is worth keeping)."""
        if self.cache is not None:
            if seq.error is None and seq.slots:
                try:
                    self._cache_tokens(seq)
                except Exception:  # noqa: BLE001 - uncached, its slots are freed below as any others
                    logging.exception("caching the tokens of sequence %d failed", seq.id)
            if seq.cache_node is not None:
                self.cache.unlock(seq.cache_node)
                seq.cache_node = None
            self._free_slots.extend(s for s in reversed(seq.slots) if not self.cache.holds(s))
        else:
            self._free_slots.extend(reversed(seq.slots))
        seq.slots = []
        self._reserved -= seq.reserved
        seq.reserved = 0
        if seq.state_slot is not None:
            self._free_states += [*reversed(seq.spare_state_slots), seq.state_slot]
            seq.state_slot, seq.spare_state_slots = None, []

    # -- synchronous use (benchmarks, tests) -------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sequence]:
        seqs = [self.add_request(p, params) for p in prompts]
        while any(s.status is not Status.FINISHED for s in seqs):
            self.step()
        return seqs

    def run_forever(self, stop: threading.Event) -> None:
        """The server's engine thread: steps while there is work, sleeps otherwise."""
        while not stop.is_set():
            if not self.has_work():
                with self.wakeup:
                    self.wakeup.wait(timeout=0.1)
                continue
            try:
                self.step()  # a failing forward pass fails its own sequences only
            except Exception as e:  # noqa: BLE001 - a scheduler bug: fail everyone, keep serving
                logging.exception("engine scheduling failed; failing every request")
                with self._lock:
                    for seq in [*self._running, *self._waiting, *self._pending]:
                        self._fail(seq, f"the engine failed: {type(e).__name__}: {e}")
                    self._running.clear()
                    self._waiting.clear()
                    self._pending.clear()


def _cacheable(seq: Sequence) -> int:
    """How much of its prompt `seq` may take from the prefix cache: not the last
    token (its logits give the first output token), and nothing from which it
    wants prompt log-probabilities (they need the logits of the row before)."""
    limit = len(seq.prompt_ids) - 1
    if seq.params.logprob_start_len >= 0:
        limit = min(limit, max(0, seq.params.logprob_start_len - 1))
    return limit


def _prompt_logprobs(row: _Row, logits: torch.Tensor) -> list[tuple[int, Optional[float], Optional[list]]]:
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

"""The engine: continuous batching of prefill and decode steps over one model.

Each step runs one forward pass over every running sequence: one decode token
for each sequence that is decoding (two make M = 2 in every projection) plus
the prompt tokens of the sequences still prefilling, at most
`chunked_prefill_size` of them per step (a long prompt is prefilled over
several steps). So a long prompt delays the others' next token by one chunk,
not by its whole prefill.

The engine is three parts and the step that joins them: scheduler.py (queues,
admission, the KV pool's slots and reservations, the prefix cache),
model_runner.py (the batch, the forward pass, sampling; the only part that
touches `dispatch`) and speculation.py (drafts and their acceptance).

A step is a transaction, as SGLang's ScheduleBatch -> forward ->
process_batch_result, and this module is where the rule lives: `_prepare` takes
the new tokens' slots and builds the batch, `_run` computes the logits and
samples, and only `_commit` changes what anyone can observe (sequences' slots and
tokens, outputs, the prefix cache). A failure before commit gives the slots back
and leaves every sequence, reservation and cache lock exactly as it was, so the
step can be retried one sequence at a time and fail only the sequence that makes
it fail; a failure in one sequence's commit fails that sequence alone.

A hybrid model (Qwen3.5) also keeps a recurrent state per sequence: two slots
of the RecurrentStatePool (models/state_pool.py) taken at admission and given
back at the end, whatever the end. A step reads a sequence's state from one and
writes the other, and `_commit` swaps them, so `_abandon` has nothing to put
back (an undo copy of the states, 18 MB a sequence for Qwen3.5-0.8B, cost more
than a tenth of an x86 decode step). With speculative decoding a sequence holds
2 + K slots: a verify step of 1 + k tokens leaves the states after each token in
a slot of its own (the delta-rule op's per-token state slots), and `_commit`
keeps the one after the last token it appends. Nothing is recomputed or copied to
roll back the rejected drafts. Their prefix cache keeps, beside the K/V, snapshots of
the recurrent states in `max_mamba_cache_size` more slots (SGLang's Mamba radix cache;
prefix_cache.py and scheduler.py say where they are taken and how a request resumes).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Optional

from absl import logging

from rvascend.engine import sampler
from rvascend.engine.draft_cost import StepCosts, parse_cost_model
from rvascend.engine.grammar import Grammar, GrammarBackend, GrammarError
from rvascend.engine.hierarchical_cache import HierarchicalCache, cache_context, hierarchical_cache
from rvascend.engine.model_runner import ModelRunner, Plan
from rvascend.engine.output import append_token
from rvascend.engine.prefix_cache import PrefixCache
from rvascend.engine.request_validation import RequestError, validate_request
from rvascend.engine.scheduler import Scheduler, cacheable
from rvascend.engine.sequence import Output, SamplingParams, Sequence, Status
from rvascend.engine.speculation import Speculator
from rvascend.engine.standalone_draft import DraftModel
from rvascend.models.decoder import CausalLM
from rvascend.models.state_pool import RecurrentStatePool
from rvascend.tokenizer.detokenizer import IncrementalDetokenizer
from rvascend.tokenizer.tokenizer import Tokenizer

__all__ = ["Engine", "EngineConfig", "QueueFullError", "RequestError"]


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
    # Hybrid models' prefix cache (SGLang's names): recurrent-state snapshots it keeps at most,
    # and the prefill tokens between two snapshots of one prompt (the default chunk's size).
    max_mamba_cache_size: int = 16
    mamba_track_interval: int = 512
    # Speculative decoding (SGLang's flags): "NGRAM" drafts up to num_draft_tokens tokens per
    # sequence from its own prompt and output (engine/ngram_draft.py), "NEXTN" with the
    # model's MTP head (engine/mtp_draft.py; Qwen3.5 loaded with it), "STANDALONE" with a
    # draft model given to the Engine (engine/standalone_draft.py); None: off.
    speculative_algorithm: Optional[str] = None
    speculative_num_draft_tokens: int = 4
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 8
    # SUFFIX: the tokens of recent requests (per API key) its drafts may come from.
    speculative_suffix_cache_tokens: int = 1 << 16
    # How many tokens each sequence drafts: "measured" chooses by this machine's measured pass
    # costs and each sequence's acceptance (draft_cost.py), "none" drafts what the budgets ask.
    speculative_step_costs: str = "measured"
    # The hierarchical cache (SGLang's HiCache flags; hierarchical_cache.py): the prefix cache's
    # pages also kept in host memory (hicache_size GiB) and, with the "file" storage backend,
    # in a directory (hicache_storage_dir, at most hicache_storage_size GiB) that outlives the process.
    enable_hierarchical_cache: bool = False
    hicache_size: float = 2.0
    hicache_storage_backend: Optional[str] = None
    hicache_storage_dir: Optional[str] = None
    hicache_storage_size: float = 16.0


class Engine:
    def __init__(self, model: CausalLM, tokenizer: Optional[Tokenizer], config: EngineConfig = EngineConfig(),
                 draft_model: Optional[CausalLM] = None, step_costs: Optional[StepCosts] = None) -> None:
        """`step_costs`: given pass costs the draft lengths are chosen by (draft_cost.py; the
        board's counted ones in bench/speculative.py) instead of config.speculative_step_costs'."""
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.context_length = min(config.context_length or model.config.max_position_embeddings,
                                  model.config.max_position_embeddings)
        self.speculator = Speculator(config.speculative_algorithm, config.speculative_num_draft_tokens,
                                     config.speculative_ngram_min_match_window_size,
                                     config.speculative_ngram_max_match_window_size,
                                     getattr(model, "mtp", None) is not None, model.config.architecture,
                                     config.speculative_suffix_cache_tokens,
                                     DraftModel(draft_model, model, config.max_total_tokens,
                                                max_catch_up=config.chunked_prefill_size or 512)
                                     if draft_model is not None else None,
                                     step_costs or parse_cost_model(config.speculative_step_costs))
        hybrid = model.config.linear_attention is not None
        # Per sequence: the state slot read, and one written per token a step keeps the states after.
        state_slots_each = 2 + self.speculator.slots_per_sequence
        state_slots = state_slots_each * config.max_running_requests if hybrid else 0
        snapshots = config.max_mamba_cache_size if hybrid and not config.disable_radix_cache else 0
        if snapshots and (config.max_mamba_cache_size < 1 or config.mamba_track_interval < 1):
            raise ValueError(f"max_mamba_cache_size ({config.max_mamba_cache_size}) and mamba_track_interval "
                             f"({config.mamba_track_interval}) must be at least 1")
        self.runner = ModelRunner(model, config.max_total_tokens, state_slots + snapshots,
                                  keep_hidden=config.speculative_algorithm == "NEXTN")
        self.speculator.calibrate(model, self.runner.pool)
        cache = None
        if not config.disable_radix_cache:
            cache = PrefixCache(config.max_total_tokens,
                                list(range(state_slots, state_slots + snapshots)) if hybrid else None)
        if snapshots:
            size = RecurrentStatePool.bytes_per_slot(model.config, next(model.parameters()).dtype) / 2**20
            logging.info("prefix cache with recurrent-state snapshots: %d of %.1f MiB (%.1f MiB), every %d prompt "
                         "tokens, at each prompt's end and each request's end", snapshots, size, snapshots * size,
                         config.mamba_track_interval)
        self.scheduler = Scheduler(config.max_running_requests, config.max_prefill_tokens, config.max_total_tokens,
                                   state_slots_each, state_slots, cache, self.runner.weights_generation(),
                                   config.mamba_track_interval)
        self.scheduler.hicache = hierarchical_cache(
            config, cache, self.runner.pool,
            lambda page_tokens: cache_context(self.runner.fingerprint(), getattr(tokenizer, "tokenizer_json", None),
                                              page_tokens))
        # One step at a time: a step owns the pool, the batch and the running list
        # from admission to commit, and `generate` may be called beside the server's
        # engine thread (which steps whenever there is work).
        self._step_lock = threading.Lock()
        self.eos_ids = set(model.config.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self._grammars: Optional[GrammarBackend] = None  # made at the first constrained request
        self.step_started: Optional[float] = None  # time.monotonic() of the step under way
        self.wakeup = threading.Condition()

    @property
    def hicache(self) -> Optional[HierarchicalCache]:
        return self.scheduler.hicache

    def close(self) -> None:
        """Finishes the cache tiers' queued disk writes (the server calls it at shutdown)."""
        if self.hicache is not None:
            queued = self.hicache.tiers.queued_jobs()  # stats() would list the whole directory
            if queued:
                logging.info("hierarchical cache: writing the %d queued pages to disk before exiting", queued)
            self.hicache.tiers.close()

    @property
    def pool(self):
        return self.runner.pool

    @property
    def states(self):
        return self.runner.states

    @property
    def cache(self) -> Optional[PrefixCache]:
        return self.scheduler.cache

    @property
    def last_batch_rows(self) -> int:
        return self.runner.last_batch_rows

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
        with self.scheduler.lock:
            if self._grammars is None:
                self._grammars = GrammarBackend(self.tokenizer.tokenizer_json, self.model.config.vocab_size,
                                                sorted(self.eos_ids))
        try:
            return self._grammars.compile(grammar)
        except GrammarError as e:
            raise RequestError(str(e)) from None

    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    on_output: Optional[Callable[[Sequence, Output], None]] = None,
                    owner: Optional[str] = None) -> Sequence:
        """`owner`: who sent it (the server: a digest of its API key); SUFFIX drafts of one
        owner come only from that owner's requests."""
        self.validate(prompt_ids, params)
        seq = Sequence(prompt_ids, params, on_output)
        seq.owner = owner
        if params.grammar is not None:
            seq.matcher = self.compile_grammar(params.grammar)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.skip_special_tokens)
        with self.scheduler.lock:
            if self.scheduler.queued >= self.config.max_queued_requests:
                raise QueueFullError(f"{self.config.max_queued_requests} requests are already queued or running")
            self.scheduler.pending.append(seq)
        if self.hicache is not None:  # its pages on disk move to host memory while it waits
            self.hicache.prefetch(prompt_ids[:cacheable(seq)])
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
        with self.scheduler.lock:
            return bool(self.scheduler.queued)

    def stats(self) -> dict[str, float]:
        """kv_used_tokens: slots requests hold (free slots and evictable cache excluded);
        kv_cached_tokens: slots the prefix cache holds (shared with requests or evictable);
        kv_locked_tokens: of those, pinned by running requests; state_slots_free /
        state_slots_total: recurrent-state slots (hybrid models; 0 otherwise);
        cache_retirements: times the cache was emptied because the weights changed;
        spec_drafted_tokens / spec_accepted_tokens: draft tokens verified, and accepted;
        spec_failed_draft_passes: drafting passes that raised (their steps drafted nothing);
        hicache_*: the hierarchical cache's pages and tiers, when it is on."""
        with self.scheduler.lock:
            stats = {**self.scheduler.stats(), "spec_drafted_tokens": self.speculator.drafted,
                     "spec_accepted_tokens": self.speculator.accepted,
                     "spec_failed_draft_passes": self.speculator.failed_passes}
        if self.hicache is not None:  # outside the lock: the disk tier's counts list its directory
            stats.update(self.hicache.stats())
        return stats

    @property
    def states_free(self) -> int:
        """Requests' worth of recurrent-state slots no request holds (hybrid models)."""
        with self.scheduler.lock:
            return len(self.scheduler.free_states) // self.scheduler.state_slots_each

    def flush_cache(self, tiers: bool = True) -> bool:
        """Empties the prefix cache, and with `tiers` the hierarchical cache's tiers (files
        included); refused (False) while requests are queued or running, or while a step is
        under way (the requests it admits are in no queue meanwhile). Never waits for a
        step: the server calls it from its event loop."""
        if not self._step_lock.acquire(blocking=False):
            return False
        try:
            with self.scheduler.lock:
                flushed = self.scheduler.flush_cache(tiers)
            if flushed:
                self.speculator.flush()  # SUFFIX's corpus: recent requests' text goes too
            return flushed
        finally:
            self._step_lock.release()

    # -- the step (one thread at a time) ----------------------------------------
    def step(self) -> int:
        """Runs one forward pass if there is work; returns the number of sequences it
        advanced. Steps from several threads run one after another."""
        with self._step_lock:
            return self._step()

    def _step(self) -> int:
        scheduler = self.scheduler
        generation = self.runner.weights_generation()
        if generation != scheduler.weights_generation and self.hicache is not None:
            # New weights, a new context (their fingerprint: seconds for a large model, so
            # outside the lock, which add_request takes); only this thread writes either.
            self.hicache.weights_changed()
        scheduler.read_in_pages(self.config.max_running_requests)
        with scheduler.lock:
            scheduler.waiting.extend(scheduler.pending)
            scheduler.pending.clear()
            scheduler.retire_stale_cache(generation)
            scheduler.drop_aborted()
            # Running from admission on, so that a failing step fails them too.
            scheduler.running.extend(scheduler.admit())
            decoding = [s for s in scheduler.running if not s.prefilling]
            prefilling = [s for s in scheduler.running if s.prefilling]
        if not decoding and not prefilling:
            return 0
        chunk = scheduler.prefill_chunk(prefilling, self.config.chunked_prefill_size)
        drafts = self.speculator.draft_step(decoding, [self._room(s) for s in decoding], self.eos_ids,
                                            len(decoding) + sum(n for _, n in chunk))
        work = [(s, 1 + len(d)) for s, d in zip(decoding, drafts)] + chunk
        self.step_started = time.monotonic()
        try:
            self._guarded_step(work)
        finally:
            self.step_started = None
        return len(work)

    def _room(self, seq: Sequence) -> int:
        """The most tokens `seq` may draft for this step (speculation.py): never past
        max_tokens or the context, so the drafts' K/V slots come out of the reservation."""
        return min(seq.params.max_tokens - len(seq.output_ids), self.context_length - seq.num_tokens) - 1

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
                    if seq.status is Status.RUNNING and seq in self.scheduler.running:
                        self._guarded_step([(seq, n)])
                return
            logging.exception("engine step failed; failing its sequence")
            with self.scheduler.lock:
                for seq, _ in work:
                    if seq in self.scheduler.running:
                        self.scheduler.running.remove(seq)
                    self.scheduler.fail(seq, f"the engine step failed: {type(e).__name__}: {e}")
            return
        self._commit(plan)

    # -- one step: prepare, run, commit -------------------------------------------
    def _prepare(self, work: list[tuple[Sequence, int]]) -> Plan:
        """The batch of `work`, with fresh slots for its new tokens; changes nothing
        else (`_abandon` gives the slots back)."""
        with self.scheduler.lock:
            fresh = self.scheduler.take_slots(sum(n for _, n in work))
            snapshots = self.scheduler.plan_snapshots(work)
        return self.runner.prepare(work, fresh, snapshots)

    def _abandon(self, plan: Plan) -> None:
        """Undoes `_prepare` (`_run` changes no sequence: each draw has a generator of its own)."""
        with self.scheduler.lock:
            for row in plan.rows:
                self.scheduler.free_slots.extend(reversed(row.fresh))
                self.scheduler.give_back_snapshots(row.snapshots)

    def _run(self, plan: Plan) -> None:
        """The forward pass, every row's sampling and the MTP head's next drafts, into the
        plan; nothing is committed."""
        self.runner.run(plan, self._grammars, self.eos_ids)
        self.speculator.target_pass(plan, self.runner.last_pass_seconds)
        self.speculator.model_drafts(self.model, self.runner.pool, plan, self.context_length, self._lend,
                                     self._give_back)

    def _lend(self, n: int) -> list[int]:
        """Free K/V slots for a drafting model's drafts (NEXTN, STANDALONE), given back within the step."""
        with self.scheduler.lock:
            return self.scheduler.lend(n)

    def _give_back(self, slots: list[int]) -> None:
        with self.scheduler.lock:
            self.scheduler.free_slots.extend(slots)

    def _commit(self, plan: Plan) -> None:
        """Applies a step that ran: tokens, outputs, slots, prompt progress, the cache.
        A sequence whose own commit fails (its client's callback, its detokenizer, its
        cache insertion) is failed alone and gives back what it holds."""
        now = time.perf_counter()
        failed: dict[int, Exception] = {}
        # Tokens first: an end inside a verified run (EOS, a stop token or string, max_tokens)
        # decides how many of the run's K/V the sequence keeps.
        for row in plan.rows:
            # Before its tokens: a client reads them when the last token says the sequence ended.
            row.seq.input_logprobs.extend(row.input_logprobs)
            if row.sample_row is None:
                continue
            try:
                if row.error is not None:
                    raise sampler.SamplingError(row.error)
                for sampled in row.sampled:  # one token, or a verified run: each as decoding emits it
                    append_token(row.seq, sampled, now, self.eos_ids)
                    row.appended += 1
                    if row.seq.finish_reason is not None:
                        break  # the rest of the run is dropped, with its K/V
            except Exception as e:  # noqa: BLE001 - fails this sequence only
                if not isinstance(e, sampler.SamplingError):
                    logging.exception("committing a token of sequence %d failed", row.seq.id)
                failed[id(row)] = e
        scheduler = self.scheduler
        ended: list[Sequence] = []
        with scheduler.lock:
            for row in plan.rows:
                # A decode row keeps the K/V of its input token and of each accepted draft
                # it appended after it (one per token appended); the rest go back now, so a
                # sequence never holds a slot past its tokens.
                kept = len(row.fresh) if row.prefill else max(1, row.appended)
                scheduler.keep(row.seq, row.fresh, kept, kept - 1 if row.drafts else 0, row.snapshots,
                               row.seq.prefilled + row.new)
                if row.drafts:
                    self.speculator.record(row)
                if row.next_draft is not None:
                    row.seq.mtp_draft = row.next_draft
                if row.draft_synced is not None:
                    row.seq.draft_synced = row.draft_synced
                if row.prefill:
                    row.seq.prefilled += row.new
            for row in plan.rows:
                seq = row.seq
                error = failed.get(id(row))
                if error is not None:
                    if seq in scheduler.running:
                        scheduler.running.remove(seq)
                    if seq.status is not Status.FINISHED:
                        scheduler.fail(seq, str(error) if isinstance(error, sampler.SamplingError)
                                       else f"{type(error).__name__}: {error}")
                    # Finished by its last token before the callback raised: what it
                    # holds goes back all the same.
                    scheduler.release(seq)
                elif seq.finish_reason is not None:
                    if seq in scheduler.running:
                        scheduler.running.remove(seq)
                    scheduler.release(seq)
                    ended.append(seq)
                elif row.prefill and row.sample_row is not None and scheduler.cache is not None \
                        and seq.status is Status.RUNNING and seq in scheduler.running:
                    # The prompt just prefilled serves the requests admitted next.
                    scheduler.cache_or_fail(seq)
        for seq in ended:  # SUFFIX: their text joins the corpus, outside the lock add_request takes
            self.speculator.finished(seq)

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
                scheduler = self.scheduler
                with scheduler.lock:
                    for seq in [*scheduler.running, *scheduler.waiting, *scheduler.pending]:
                        scheduler.fail(seq, f"the engine failed: {type(e).__name__}: {e}")
                    scheduler.running.clear()
                    scheduler.waiting.clear()
                    scheduler.pending.clear()

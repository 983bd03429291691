"""The engine: FCFS admission against the KV pool, prefill and batched decode steps.

Each step runs one forward pass over every running sequence: one decode token
for each sequence that is decoding (two make M = 2 in every projection) plus
the prompt tokens of the sequences still prefilling, at most
`chunked_prefill_size` of them per step (a long prompt is prefilled over
several steps). So a long prompt delays the others' next token by one chunk,
not by its whole prefill. KV memory
is reserved at admission for prompt + max_tokens, so a running request never
runs out of slots; requests wait until their reservation fits.

The prefix cache (prefix_cache.py) keeps the K/V of finished and fully
prefilled prompts; a new request starts prefilling after the longest cached
prefix of its prompt. Cached slots nobody uses are evicted when the free list
runs dry. The reservation stays prompt + max_tokens, cached part included: every
slot a running request refers to is counted in its own reservation, so shared
slots never overcommit the pool (sharing saves compute and time to first token,
not admission room).
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
from rvascend.engine.detokenizer import IncrementalDetokenizer
from rvascend.engine.prefix_cache import PrefixCache, common_prefix_len
from rvascend.engine.sequence import Output, SamplingParams, Sequence, Status
from rvascend.engine.tokenizer import Tokenizer
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.policy.kernel_routes import routes_of


# Shared uncached prompt tokens that make a request wait for another one's prefill.
SHARED_PREFILL_WAIT = 32


class RequestError(ValueError):
    """A request that can never be served as asked (the client's fault)."""


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


class Engine:
    def __init__(self, model: CausalLM, tokenizer: Optional[Tokenizer], config: EngineConfig = EngineConfig()) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.context_length = min(config.context_length or model.config.max_position_embeddings,
                                  model.config.max_position_embeddings)
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(model.config, config.max_total_tokens, dtype)
        self._free_slots = list(range(config.max_total_tokens - 1, -1, -1))
        self.cache = None if config.disable_radix_cache else PrefixCache(config.max_total_tokens)
        self._reserved = 0
        self._lock = threading.Lock()
        self._pending: collections.deque[Sequence] = collections.deque()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._running: list[Sequence] = []
        self.eos_ids = set(model.config.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self.last_batch_rows = 0
        self.step_started: Optional[float] = None  # time.monotonic() of the step under way
        self.wakeup = threading.Condition()

    # -- requests (any thread) ---------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if params.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if len(prompt_ids) >= self.context_length:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context length is "
                               f"{self.context_length}")
        if len(prompt_ids) + params.max_tokens > self.context_length:
            raise RequestError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                               f"the context length of {self.context_length}")
        if len(prompt_ids) + params.max_tokens > self.config.max_total_tokens:
            raise RequestError(f"prompt + max_tokens = {len(prompt_ids) + params.max_tokens} tokens exceeds the "
                               f"KV pool of {self.config.max_total_tokens} tokens")
        vocab = self.model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary of {vocab}")
        if not 0.0 <= params.temperature <= 100.0:
            raise RequestError(f"temperature must be in [0, 100], got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_k < -1:
            raise RequestError(f"top_k must be -1 (off), 0 (off) or positive, got {params.top_k}")
        if not 0.0 <= params.min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {params.min_p}")
        if not 0.0 < params.repetition_penalty <= 2.0:
            raise RequestError(f"repetition_penalty must be in (0, 2], got {params.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(params, name)
            if not -2.0 <= value <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2], got {value}")
        if not 0 <= params.min_tokens <= params.max_tokens:
            raise RequestError(f"min_tokens must be in [0, max_tokens = {params.max_tokens}], "
                               f"got {params.min_tokens}")
        for t in params.stop_token_ids:
            if not 0 <= t < vocab:
                raise RequestError(f"stop_token_ids: {t} is outside the vocabulary of {vocab}")
        for t, bias in params.logit_bias:
            if not 0 <= t < vocab:
                raise RequestError(f"logit_bias: token {t} is outside the vocabulary of {vocab}")
            if not -100.0 <= bias <= 100.0:
                raise RequestError(f"logit_bias: the bias of token {t} must be in [-100, 100], got {bias}")
        if params.logprobs is not None and not 0 <= params.logprobs <= 20:
            raise RequestError(f"logprobs must be in [0, 20], got {params.logprobs}")
        if params.seed is not None and not -(2**63) <= params.seed < 2**64:
            raise RequestError(f"seed must fit in 64 bits, got {params.seed}")

    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    on_output: Optional[Callable[[Sequence, Output], None]] = None) -> Sequence:
        self.validate(prompt_ids, params)
        seq = Sequence(prompt_ids, params, on_output)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids)
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
        kv_cached_tokens: slots the prefix cache holds (shared with requests or evictable)."""
        with self._lock:
            cache = self.cache
            evictable = cache.evictable_size if cache else 0
            return {"running": len(self._running), "waiting": len(self._waiting) + len(self._pending),
                    "kv_used_tokens": self.config.max_total_tokens - len(self._free_slots) - evictable,
                    "kv_cached_tokens": cache.size if cache else 0,
                    "kv_reserved_tokens": self._reserved, "kv_total_tokens": self.config.max_total_tokens,
                    "cache_hit_rate": cache.hit_rate if cache else 0.0}

    def flush_cache(self) -> bool:
        """Empties the prefix cache; refused (False) while requests are queued or running."""
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

    # -- the step (engine thread only) ------------------------------------------
    def step(self) -> int:
        """Runs one forward pass if there is work; returns the number of sequences it advanced."""
        with self._lock:
            self._waiting.extend(self._pending)
            self._pending.clear()
        self._drop_aborted()
        admitted = self._admit()
        with self._lock:
            # Running from admission on, so that a failing step fails them too.
            self._running.extend(admitted)
            decoding = [s for s in self._running if not s.prefilling]
            prefilling = [s for s in self._running if s.prefilling]
        if not decoding and not prefilling:
            return 0
        work = [(s, 1) for s in decoding] + self._prefill_chunk(prefilling)
        self._guarded_forward(work)
        return len(work)

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

    def _guarded_forward(self, work: list[tuple[Sequence, int]]) -> None:
        """A failing forward pass fails exactly the sequences that make it fail: a
        step of several sequences that raises is run again one sequence at a time
        (its slot allocations were undone; K/V rewritten to the same slots are the
        same values), so one poisoned request in a mixed prefill/decode step does
        not take the running ones with it. Each failing sequence gets an error, its
        slots and reservation are freed, everyone else goes on."""
        self.step_started = time.monotonic()
        seqs = [s for s, _ in work]
        try:
            self._forward(work)
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            if len(work) > 1:
                logging.warning("an engine step of %d sequences failed (%s: %s); running them one at a time",
                                len(work), type(e).__name__, e)
                for item in work:
                    if item[0].status is Status.RUNNING and item[0] in self._running:
                        self._guarded_forward([item])
                return
            logging.exception("engine step failed; failing its %d sequences", len(seqs))
            with self._lock:
                for seq in seqs:
                    if seq in self._running:
                        self._running.remove(seq)
                    if seq.status is not Status.FINISHED:
                        self._fail(seq, f"the engine step failed: {type(e).__name__}: {e}")
                    elif seq.reserved or seq.slots:
                        self._release(seq)
        finally:
            self.step_started = None

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        tokens = 0
        with self._lock:
            while self._waiting and len(self._running) + len(admitted) < self.config.max_running_requests:
                seq = self._waiting[0]
                if self._reserved + seq.reserved > self.config.max_total_tokens:
                    break  # FCFS: the head waits for memory, nobody overtakes it
                if admitted and tokens + len(seq.prompt_ids) > self.config.max_prefill_tokens:
                    break
                if self._shares_a_prefill_under_way(seq, admitted):
                    break  # admitted once that prefill is cached, it prefills only the rest
                self._waiting.popleft()
                self._reserved += seq.reserved
                tokens += len(seq.prompt_ids)
                seq.status = Status.RUNNING
                self._reuse_cached_prefix(seq)
                admitted.append(seq)
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
                shared = common_prefix_len(other.prompt_ids, seq.prompt_ids[:-1])
                if shared >= other.cached_tokens + SHARED_PREFILL_WAIT:
                    return True
        return False

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Starts `seq` after the longest cached prefix of its prompt (caller holds the lock).
        The last prompt token always runs: its logits give the first output token."""
        if self.cache is None:
            return
        slots, node = self.cache.match(seq.prompt_ids[:-1])
        self.cache.lock(node)
        seq.cache_node = node
        seq.slots = list(slots)
        seq.prefilled = seq.cached_tokens = len(slots)
        self.cache.hit_tokens += len(slots)
        self.cache.queried_tokens += len(seq.prompt_ids)

    def _cache_tokens(self, seq: Sequence) -> None:
        """Gives the K/V `seq` has written to the prefix cache and moves its lock to
        their end (caller holds the lock). Where the tree had the same tokens already,
        `seq` switches to the tree's slots and frees its own copies."""
        tokens = (seq.prompt_ids + seq.output_ids)[:len(seq.slots)]
        node, tree_slots = self.cache.insert(tokens, seq.slots)
        self._free_slots.extend(s for s, t in zip(seq.slots, tree_slots) if s != t)
        seq.slots = tree_slots
        self.cache.lock(node)
        if seq.cache_node is not None:
            self.cache.unlock(seq.cache_node)
        seq.cache_node = node

    def _take_slots(self, n: int) -> list[int]:
        """n free slots, evicting unused cached prefixes if the free list is short (caller holds the lock)."""
        if len(self._free_slots) < n and self.cache is not None:
            self._free_slots.extend(self.cache.evict(n - len(self._free_slots)))
        if len(self._free_slots) < n:  # the reservations make this unreachable
            raise RuntimeError(f"the KV pool has {len(self._free_slots)} free slots, {n} needed")
        return [self._free_slots.pop() for _ in range(n)]

    def _drop_aborted(self) -> None:
        with self._lock:
            for seq in [s for s in self._waiting if s.aborted]:
                self._waiting.remove(seq)
                self._finish(seq, "abort")
            for seq in [s for s in self._running if s.aborted]:
                self._running.remove(seq)
                self._finish(seq, "abort")

    def _forward(self, work: list[tuple[Sequence, int]]) -> None:
        """One forward pass: `n` prompt tokens of each prefilling sequence, the last
        token of each decoding one; then a token for every sequence whose prompt is done."""
        ids, positions, new_lens, prefix_lens, kv_slots, write = [], [], [], [], [], []
        seqs = [s for s, _ in work]
        prefill = [s.prefilling for s in seqs]
        allocated: list[tuple[Sequence, list[int]]] = []
        try:
            with self._lock:
                for (seq, n), chunk in zip(work, prefill):
                    new = seq.prompt_ids[seq.prefilled:seq.prefilled + n] if chunk else [seq.last_token]
                    start = seq.prefilled if chunk else seq.num_tokens - 1
                    fresh = self._take_slots(len(new))
                    seq.slots.extend(fresh)
                    allocated.append((seq, fresh))
                    ids.extend(new)
                    positions.extend(range(start, start + len(new)))
                    new_lens.append(len(new))
                    prefix_lens.append(start)
                    kv_slots.append(torch.tensor(seq.slots, dtype=torch.long))
                    write.extend(fresh)
            batch = ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                                 new_lens, prefix_lens, kv_slots, torch.tensor(write, dtype=torch.long))
            self.last_batch_rows = len(ids)
            with torch.inference_mode():
                logits = self.model(batch, self.pool)
        except BaseException:
            with self._lock:  # undo this step's slot allocations
                for seq, fresh in allocated:
                    del seq.slots[len(seq.slots) - len(fresh):]
                    self._free_slots.extend(reversed(fresh))
            raise
        for (seq, n), chunk in zip(work, prefill):
            if chunk:
                seq.prefilled += n
        # A sequence whose prompt is not complete yet samples nothing this step.
        done = [i for i, s in enumerate(seqs) if not s.prefilling]
        if len(done) < len(seqs):
            seqs, logits = [seqs[i] for i in done], logits[done]
        if not seqs:
            return
        self._sample(seqs, logits)
        if self.cache is not None:
            with self._lock:  # prompts prefilled this step serve the requests admitted next
                for seq, chunk in zip(seqs, (prefill[i] for i in done)):
                    if chunk and seq.status is Status.RUNNING and seq in self._running:
                        self._cache_tokens(seq)
        finished = [s for s in seqs if s.finish_reason is not None]
        if finished:
            with self._lock:
                for seq in finished:
                    if seq in self._running:
                        self._running.remove(seq)
                    self._release(seq)

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """A token for each sequence (one whose sampling fails is failed and removed)."""
        now = time.perf_counter()
        eos = tuple(self.eos_ids)
        fast = self._greedy_tokens(seqs, logits)
        for i, (seq, row) in enumerate(zip(seqs, logits)):
            try:
                if fast is not None:
                    if fast[i] < 0:
                        raise sampler.SamplingError("the model produced NaN logits for this sequence")
                    sampled = sampler.Sampled(fast[i])
                else:
                    sampled = sampler.sample(row, seq.params, seq.generator, seq.prompt_ids, seq.output_ids, eos)
            except sampler.SamplingError as e:
                with self._lock:
                    self._running.remove(seq)
                    self._fail(seq, str(e))
                continue
            seq.output_ids.append(sampled.token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.token_times.append(now)
            self._emit(seq, sampled)

    def _greedy_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> Optional[list[int]]:
        """Every row's argmax in one kernel call when all rows are plain greedy and routed, else None."""
        routes = routes_of(self.model)
        if routes is None or not all(sampler.plain_greedy(s.params, len(s.output_ids)) for s in seqs):
            return None
        if not routes.use("argmax", logits, rows=len(seqs)):
            return None
        return ops.elementwise.argmax(logits).tolist()

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

    def _release(self, seq: Sequence) -> None:
        """Returns a finished sequence's slots and reservation (caller holds the lock).
        Its K/V go to the prefix cache unless it failed (a failed step's writes are undone,
        but nothing of a request that errored is worth keeping)."""
        if self.cache is not None:
            if seq.error is None and seq.slots:
                self._cache_tokens(seq)
            if seq.cache_node is not None:
                self.cache.unlock(seq.cache_node)
                seq.cache_node = None
            self._free_slots.extend(s for s in reversed(seq.slots) if not self.cache.holds(s))
        else:
            self._free_slots.extend(reversed(seq.slots))
        seq.slots = []
        self._reserved -= seq.reserved
        seq.reserved = 0

    def _finish(self, seq: Sequence, reason: str, error: Optional[str] = None) -> None:
        seq.finish_reason = reason
        if seq.status is Status.RUNNING:
            self._release(seq)
        seq.status = Status.FINISHED
        if seq.on_output is not None:
            seq.on_output(seq, Output("", None, True, reason, error=error))

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

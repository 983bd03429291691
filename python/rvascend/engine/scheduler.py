"""Admission and memory: the request queues, the KV pool's free slots and reservations,
the recurrent-state slots and the prefix cache (SGLang's scheduler and its allocators).

FCFS admission against the KV pool: KV memory is reserved at admission for prompt +
max_tokens, so a running request never runs out of slots; requests wait until their
reservation fits. The reservation stays prompt + max_tokens, cached part included: every
slot a running request refers to is counted in its own reservation, so shared slots
never overcommit the pool (sharing saves compute and time to first token, not admission
room). A hybrid model's sequence also holds recurrent-state slots (engine.py says how
many and why) from admission to release.

The prefix cache (prefix_cache.py) keeps the K/V of finished and fully prefilled
prompts; a new request starts prefilling after the longest cached prefix of its prompt.
Cached slots nobody uses are evicted when the free list runs dry. When the model's
weights change the cache is retired before the next step.

For a hybrid model the cache also keeps snapshots of the recurrent states, taken at
three kinds of points: every `mamba_track_interval` tokens of a prefill (SGLang's
name), at a prompt's last cacheable token (a request that repeats the prompt, `n > 1`),
and at a request's end (the next turn of its conversation starts there). None is
recomputed or copied: a point inside a prefill chunk is a token slot of the delta-rule
op (the states after that token are also written to a slot of their own); at a chunk's
last token the sequence's own state slot becomes the snapshot and the sequence reads
its next step's states from it (its own slot is written then); at a request's end its
state slot becomes the snapshot and a free snapshot slot goes back to the sequences'.

With the hierarchical cache (hierarchical_cache.py) the pages the tree takes are also
copied to the cache tiers, and an admitted request whose prompt reaches past the tree's
prefix has the next pages loaded from them into free slots and inserted into the tree
before it matches.

Every method but `lock`'s own users (read_in_pages) expects the caller to hold `lock`.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Optional

from absl import logging

from rvascend.engine.hierarchical_cache import HierarchicalCache
from rvascend.engine.prefix_cache import PrefixCache, common_prefix_len
from rvascend.engine.sequence import Output, Sequence, Status

# Shared uncached prompt tokens that make a request wait for another one's prefill.
SHARED_PREFILL_WAIT = 32


class Scheduler:
    def __init__(self, max_running: int, max_prefill_tokens: int, pool_slots: int, state_slots_each: int,
                 state_slots: int, cache: Optional[PrefixCache], weights_generation: int,
                 track_interval: int = 0) -> None:
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.pool_slots = pool_slots
        self.lock = threading.Lock()
        self.pending: collections.deque[Sequence] = collections.deque()  # added since the last step
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.free_slots = list(range(pool_slots - 1, -1, -1))
        self.state_slots_each = state_slots_each
        self.state_slots = state_slots
        self.free_states = list(range(state_slots - 1, -1, -1))
        self.cache = cache
        self.reserved = 0
        self.weights_generation = weights_generation  # of the weights the cached K/V were computed with
        self.track_interval = track_interval  # hybrid models: prefill tokens between state snapshots
        self.hicache: Optional[HierarchicalCache] = None  # the cache's pages beyond the pool (the engine sets it)

    # -- queues ----------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self.pending) + len(self.waiting) + len(self.running)

    def stats(self) -> dict[str, float]:
        cache = self.cache
        evictable = cache.evictable_size if cache else 0
        return {"running": len(self.running), "waiting": len(self.waiting) + len(self.pending),
                "kv_used_tokens": self.pool_slots - len(self.free_slots) - evictable,
                "kv_cached_tokens": cache.size if cache else 0,
                "kv_locked_tokens": cache.locked_size if cache else 0,
                "state_slots_free": len(self.free_states), "state_slots_total": self.state_slots,
                "kv_reserved_tokens": self.reserved, "kv_total_tokens": self.pool_slots,
                "cache_hit_rate": cache.hit_rate if cache else 0.0,
                "cache_retirements": cache.retirements if cache else 0,
                "mamba_cache_snapshots": cache.snapshots if cache else 0,
                "mamba_cache_size": cache.state_slots if cache else 0,
                "mamba_cache_evictions": cache.snapshots_evicted if cache else 0}

    def flush_cache(self, tiers: bool = True) -> bool:
        """Empties the prefix cache (and with `tiers`, the cache tiers); refused (False)
        while requests are queued or running."""
        if self.cache is None:
            return True
        if self.queued:
            return False
        freed = self.cache.flush()
        if freed is None:
            return False
        self.free_slots.extend(freed)
        if tiers and self.hicache is not None:
            self.hicache.tiers.flush()
        return True

    def retire_stale_cache(self, generation: int) -> None:
        """Drops cached K/V computed with weights that have changed since."""
        if generation == self.weights_generation:
            return
        self.weights_generation = generation
        if self.cache is not None:
            self.free_slots.extend(self.cache.retire())
            logging.info("the model's weights changed: the prefix cache was emptied")

    # -- admission ----------------------------------------------------------------------
    def admit(self) -> list[Sequence]:
        """Admits waiting requests in arrival order while their reservations fit. A
        request that shares a prefill under way steps aside (it will hit the cache
        once that prefill is done) without holding up the requests behind it."""
        admitted: list[Sequence] = []
        deferred: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            seq = self.waiting[0]
            if self._shares_a_prefill_under_way(seq, admitted):
                deferred.append(self.waiting.popleft())
                continue
            if self.reserved + seq.reservation > self.pool_slots:
                break  # FCFS: the head waits for memory, nobody overtakes it
            if self.state_slots and len(self.free_states) < self.state_slots_each:
                break  # every slot held (unreachable while running requests <= max_running)
            if admitted and tokens + len(seq.prompt_ids) > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            seq.reserved = seq.reservation
            self.reserved += seq.reserved
            tokens += len(seq.prompt_ids)
            seq.status = Status.RUNNING
            seq.weights_generation = self.weights_generation
            self.take_state_slots(seq)
            self._reuse_cached_prefix(seq)
            admitted.append(seq)
        self.waiting.extendleft(reversed(deferred))
        return admitted

    def take_state_slots(self, seq: Sequence) -> None:
        """A hybrid model's sequence's recurrent-state slots, from admission to release (the
        caller has checked there are enough)."""
        if self.state_slots:
            seq.state_slot = self.free_states.pop()
            seq.spare_state_slots = [self.free_states.pop() for _ in range(self.state_slots_each - 1)]

    def _shares_a_prefill_under_way(self, seq: Sequence, admitted: list[Sequence]) -> bool:
        """Whether a request being prefilled is computing at least SHARED_PREFILL_WAIT
        prompt tokens `seq` starts with. Then `seq` waits for it (SGLang's in-batch prefix
        caching): prefilling the same tokens twice would only slow both down, and once
        they are cached `seq` prefills only its own rest."""
        if self.cache is None:
            return False
        for other in [*self.running, *admitted]:
            if other.prefilling:
                shared = common_prefix_len(other.prompt_ids, seq.prompt_ids[:cacheable(seq)])
                if shared >= other.cached_tokens + SHARED_PREFILL_WAIT:
                    return True
        return False

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Starts `seq` after the longest cached prefix of its prompt."""
        if self.cache is None:
            return
        prompt = seq.prompt_ids[:cacheable(seq)]
        slots, node = self.cache.match(prompt)
        if self.hicache is not None and self._load_from_tiers(prompt, slots, node):
            slots, node = self.cache.match(prompt)
        self.cache.lock(node)
        seq.cache_node = node
        if node.state is not None:  # a hybrid model's prefix: its first step reads the snapshot
            self.cache.pin_state(node)
            seq.state_source, seq.state_read_from = node, node.state
        seq.slots = list(slots)
        seq.prefilled = seq.cached_tokens = len(slots)
        self.cache.hit_tokens += len(slots)
        self.cache.queried_tokens += len(seq.prompt_ids)

    def read_in_pages(self, upcoming: int) -> None:
        """Reads the pages of the `upcoming` requests next in line from disk into host memory
        (hierarchical_cache.py), taking `lock` only to pick them: admission, under the lock,
        then finds them in memory. Their prefetch may have done it already."""
        if self.hicache is None or self.hicache.tiers.disk is None:
            return
        with self.lock:
            work = []
            for seq in itertools.islice(itertools.chain(self.waiting, self.pending), upcoming):
                if not seq.pages_read:
                    seq.pages_read = True
                    prompt = seq.prompt_ids[:cacheable(seq)]
                    work.append((prompt, len(self.cache.match(prompt)[0])))
        for prompt, have in work:
            try:
                self.hicache.read_in(prompt, have)
            except Exception:  # noqa: BLE001 - a miss: admission prefills instead
                logging.exception("reading pages from the cache tiers failed")

    def _load_from_tiers(self, prompt: list[int], held: list[int], node) -> bool:
        """Extends the tree with the pages of `prompt` the cache tiers hold past its cached
        prefix (`held`, its slots, ending at `node`: the tree's match), into free slots;
        whether it did. Anything going wrong is a miss: the request prefills those tokens
        instead."""
        try:
            loaded = self.hicache.fetch(prompt, len(held))
        except Exception:  # noqa: BLE001 - a tier's failure costs a prefill, never the request
            logging.exception("reading the cache tiers failed")
            return False
        if loaded is None:
            return False
        self.cache.lock(node)  # the prefix the pages continue stays while slots are taken for them
        state, fresh = None, []
        try:
            if self.hicache.hybrid:
                state = self.cache.take_state()
                if state is None:  # every snapshot slot is about to be read
                    return False
            fresh = self.take_slots(loaded.end - loaded.start)
            self.hicache.write(loaded, fresh, state)
            _, tree_slots = self.cache.insert(prompt[:loaded.end], held + fresh,
                                              {loaded.end: state} if state is not None else None)
            state = None  # the tree's now (or given back by it)
            self.free_slots.extend(s for s, t in zip(fresh, tree_slots[loaded.start:]) if s != t)
            fresh = []
            return True
        except Exception:  # noqa: BLE001 - as above
            logging.exception("loading %d tokens from the cache tiers failed", loaded.end - loaded.start)
            return False
        finally:
            if state is not None:
                self.cache.give_state(state)
            self.free_slots.extend(reversed(fresh))
            self.cache.unlock(node)

    @staticmethod
    def prefill_chunk(prefilling: list[Sequence], budget: Optional[int]) -> list[tuple[Sequence, int]]:
        """(sequence, prompt tokens to prefill now), in arrival order, within `budget`
        prompt tokens (None or <= 0: whole prompts)."""
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

    def plan_snapshots(self, work: list[tuple[Sequence, int]]) -> list[list[tuple[int, int]]]:
        """Per item of `work`, the (tokens, snapshot slot) points its prefill rows keep the
        recurrent states at: every track_interval tokens and the prompt's last cacheable
        token, within this chunk (fewer when every snapshot slot is pinned)."""
        cache = self.cache
        plans: list[list[tuple[int, int]]] = []
        for seq, n in work:
            points: list[tuple[int, int]] = []
            if cache is not None and cache.hybrid and seq.prefilling and \
                    seq.weights_generation == self.weights_generation:
                start, limit = seq.prefilled, min(cacheable(seq), seq.prefilled + n)
                wanted = set(range(start - start % self.track_interval + self.track_interval, limit + 1,
                                   self.track_interval))
                if start < limit == cacheable(seq):
                    wanted.add(limit)
                for p in sorted(wanted):
                    slot = cache.take_state()
                    if slot is None:
                        break
                    points.append((p, slot))
            plans.append(points)
        return plans

    def give_back_snapshots(self, points: list[tuple[int, int]]) -> None:
        for _, slot in points:
            self.cache.give_state(slot)

    # -- slots ---------------------------------------------------------------------------
    def take_slots(self, n: int) -> list[int]:
        """n free slots, evicting unused cached prefixes if the free list is short."""
        if len(self.free_slots) < n and self.cache is not None:
            self.free_slots.extend(self.cache.evict(n - len(self.free_slots)))
        if len(self.free_slots) < n:  # the reservations make this unreachable
            raise RuntimeError(f"the KV pool has {len(self.free_slots)} free slots, {n} needed")
        taken = self.free_slots[len(self.free_slots) - n:]
        del self.free_slots[len(self.free_slots) - n:]
        taken.reverse()
        return taken

    def lend(self, n: int) -> list[int]:
        """Up to n free slots for the step's own scratch (given back before it commits)."""
        n = min(n, len(self.free_slots))
        taken = self.free_slots[len(self.free_slots) - n:]
        del self.free_slots[len(self.free_slots) - n:]
        return taken

    def keep(self, seq: Sequence, fresh: list[int], kept: int, newest_state: int,
             snapshots: list[tuple[int, int]] = (), end: int = 0) -> None:
        """A step's commit for `seq`: it keeps the first `kept` of the step's `fresh` K/V slots
        (the rest go back) and the states after its last kept token, in its spare state slot
        `newest_state` (the one it read from becomes a spare). A prefill chunk's `snapshots`
        (ending at `end` tokens) are kept for the prefix cache."""
        seq.slots.extend(fresh[:kept])
        self.free_slots.extend(reversed(fresh[kept:]))
        if self.state_slots:
            newest = seq.spare_state_slots[newest_state]
            seq.spare_state_slots = [s for s in seq.spare_state_slots if s != newest] + [seq.state_slot]
            seq.state_slot = newest
            if seq.state_source is not None:  # the cached snapshot it resumed after was read
                self.cache.unpin_state(seq.state_source)
                seq.state_source = None
            seq.state_read_from = None
        for p, slot in snapshots:
            if p == end:
                # The chunk's last token: its states are in the sequence's slot, which becomes the
                # snapshot; the sequence reads its next step from there and takes the free slot.
                seq.pending_snapshots.append((p, seq.state_slot))
                seq.state_read_from, seq.state_slot = seq.state_slot, slot
            else:
                seq.pending_snapshots.append((p, slot))

    # -- the prefix cache ------------------------------------------------------------------
    def cache_tokens(self, seq: Sequence, ending: bool = False) -> None:
        """Gives the K/V `seq` has written to the prefix cache, with its snapshots, and
        moves its lock to their end. Where the tree had the same tokens already, `seq`
        switches to the tree's slots and frees its own copies. K/V of weights that have
        changed since the sequence was admitted are never cached. `ending`: the sequence
        ends, its states (after its last cached token) become a snapshot too."""
        cache = self.cache
        if seq.weights_generation != self.weights_generation:
            self.give_back_snapshots(seq.pending_snapshots)
            seq.pending_snapshots = []
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:len(seq.slots)]
        states = dict(seq.pending_snapshots)
        swap = None  # the free snapshot slot the sequence takes for the one it gives
        if ending and cache.hybrid and seq.state_read_from is None and seq.state_slot is not None and tokens \
                and len(tokens) not in states:
            swap = cache.take_state()
            if swap is not None:
                states[len(tokens)] = seq.state_slot
        if self.hicache is not None:
            try:
                self.hicache.store(tokens, seq.slots, states)
            except Exception:  # noqa: BLE001 - the tiers are a copy: the radix cache goes on without it
                logging.exception("copying sequence %d's pages to the cache tiers failed", seq.id)
        try:
            node, tree_slots = cache.insert(tokens, seq.slots, states)
        except Exception:
            if swap is not None:
                cache.give_state(swap)
            raise
        seq.pending_snapshots = []
        if swap is not None:
            seq.state_slot = swap
        self.free_slots.extend(s for s, t in zip(seq.slots, tree_slots) if s != t)
        seq.slots = tree_slots
        self.cache.lock(node)
        if seq.cache_node is not None:
            self.cache.unlock(seq.cache_node)
        seq.cache_node = node

    def cache_or_fail(self, seq: Sequence) -> None:
        """Caches the prompt `seq` has prefilled; if that fails, `seq` alone fails and gives
        back what it holds."""
        try:
            self.cache_tokens(seq)
        except Exception as e:  # noqa: BLE001 - this sequence's failure, not the step's
            logging.exception("caching the prompt of sequence %d failed", seq.id)
            self.running.remove(seq)
            self.fail(seq, f"caching its prompt failed: {type(e).__name__}: {e}")

    # -- endings -------------------------------------------------------------------------
    def release(self, seq: Sequence) -> None:
        """Returns whatever a sequence holds: slots, reservation, prefix-cache lock,
        recurrent-state slots. Idempotent, and decided on what is held, not on the
        sequence's status, so every way a sequence ends can call it. Its K/V go to the
        prefix cache unless it failed (nothing of a request that errored is worth keeping)."""
        if self.cache is not None:
            if seq.error is None and seq.slots:
                try:
                    self.cache_tokens(seq, ending=True)
                except Exception:  # noqa: BLE001 - uncached, its slots are freed below as any others
                    logging.exception("caching the tokens of sequence %d failed", seq.id)
            self.give_back_snapshots(seq.pending_snapshots)  # failed, or never cached
            seq.pending_snapshots = []
            if seq.state_source is not None:
                self.cache.unpin_state(seq.state_source)
                seq.state_source = None
            seq.state_read_from = None
            if seq.cache_node is not None:
                self.cache.unlock(seq.cache_node)
                seq.cache_node = None
            self.free_slots.extend(s for s in reversed(seq.slots) if not self.cache.holds(s))
        else:
            self.free_slots.extend(reversed(seq.slots))
        seq.slots = []
        self.reserved -= seq.reserved
        seq.reserved = 0
        if seq.state_slot is not None:
            self.free_states += [*reversed(seq.spare_state_slots), seq.state_slot]
            seq.state_slot, seq.spare_state_slots = None, []

    def fail(self, seq: Sequence, message: str) -> None:
        """Ends a sequence with an error the client sees."""
        seq.error = message
        self.finish(seq, "error", message)

    def finish(self, seq: Sequence, reason: str, error: Optional[str] = None) -> None:
        seq.finish_reason = reason
        self.release(seq)
        seq.status = Status.FINISHED
        if seq.on_output is not None:
            try:
                seq.on_output(seq, Output("", None, True, reason, error=error))
            except Exception:  # noqa: BLE001 - the client is gone; the engine goes on
                logging.exception("the output callback of sequence %d failed", seq.id)

    def drop_aborted(self) -> None:
        for seq in [s for s in self.waiting if s.aborted]:
            self.waiting.remove(seq)
            self.finish(seq, "abort")
        for seq in [s for s in self.running if s.aborted]:
            self.running.remove(seq)
            self.finish(seq, "abort")


def cacheable(seq: Sequence) -> int:
    """How much of its prompt `seq` may take from the prefix cache: not the last
    token (its logits give the first output token), and nothing from which it
    wants prompt log-probabilities (they need the logits of the row before)."""
    limit = len(seq.prompt_ids) - 1
    if seq.params.logprob_start_len >= 0:
        limit = min(limit, max(0, seq.params.logprob_start_len - 1))
    return limit

"""The hierarchical cache: the prefix cache's K/V and recurrent-state snapshots copied,
page by page, to the cache tiers (cache_tiers.py: host memory, then a directory of
files), and loaded back into the pool when a prompt reaches past what the radix tree
holds (SGLang's HiCache with its file storage backend).

A page is `page_tokens` tokens at a fixed place (tokens [k * P, (k + 1) * P)); its
entry holds every attention layer's K/V of those tokens. Pages are chained: page k's
key is its tokens under a context that is page k - 1's digest (page 0's: the model's
context, `cache_context`), so a key names the whole prefix and yet hashing the keys of
a prompt reads each token once. A hybrid model (Qwen3.5) cannot resume after K/V
alone: beside a page whose end has a recurrent-state snapshot the tiers keep that
snapshot as an entry of its own (key: no tokens under the page's digest), so a page
stored first without it (a decode's K/V) is completed later by a prefill that crossed
its end; the page is the snapshot interval (`mamba_track_interval`), the only places
snapshots are taken inside a prompt.

Write-through (SGLang's `write_through` policy): whenever the radix tree takes a
sequence's tokens (a prompt prefilled, a request ended), the whole pages among them
that the tiers lack go to the host tier and, on the tiers' own thread, to disk. When a
request is admitted, the pages past the tree's prefix are read back (host first; a
disk read is promoted to host) into free pool slots and inserted into the tree, and
the request matches them as any cached prefix. `prefetch`, called as a request
arrives, moves its pages from disk to host on the tiers' thread while the engine
steps, so admission finds them in memory.

Equal keys mean equal bits: the context digests everything that decides them (the
weights' bytes, dtype, kernel route, deterministic mode, the kernel sets this CPU runs,
threads, the tokenizer, the page size, this layout's version), so an entry from other
weights, another route or another build is a miss, never a wrong answer. Entries are
checked against the pool's shapes before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Callable, Optional

import torch
from absl import logging

from rvascend.engine.cache_tiers import CacheTiers, EntryKey, HostTier, Tensors
from rvascend.engine.disk_tier import DiskTier
from rvascend.engine.prefix_cache import PrefixCache
from rvascend.models.decoder import KVPool

LAYOUT_VERSION = 1
DENSE_PAGE_TOKENS = 256  # a dense model's page: small enough that a prompt loses little to its tail


def cache_context(model_fingerprint: str, tokenizer_json: Optional[str], page_tokens: int) -> str:
    """The tiers' context: the model side (ModelRunner.fingerprint) and what the engine adds."""
    h = hashlib.sha256(json.dumps({"model": model_fingerprint, "page_tokens": page_tokens,
                                   "layout": LAYOUT_VERSION}, sort_keys=True).encode())
    h.update(hashlib.sha256((tokenizer_json or "").encode()).digest())
    return h.hexdigest()


@dataclasses.dataclass
class Loaded:
    """Pages read from the tiers for a prompt: its K/V from `start` to `end` (per layer,
    [end - start, kv_heads, head_dim]) and, for a hybrid model, the states after `end`."""
    start: int
    end: int
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    states: Optional[Tensors] = None


def hierarchical_cache(config, cache: Optional[PrefixCache], pool: KVPool,
                       context_of: Callable[[int], str]) -> Optional[HierarchicalCache]:
    """The engine's hierarchical cache as its config (EngineConfig's hicache fields) asks,
    or None; ValueError naming the flag that is wrong. `context_of(page_tokens)`: the
    tiers' context of the model as it is now (cache_context)."""
    if config.hicache_storage_backend is not None and not config.enable_hierarchical_cache:
        raise ValueError("--hicache-storage-backend needs --enable-hierarchical-cache")
    if not config.enable_hierarchical_cache:
        return None
    host_bytes, disk_bytes = int(config.hicache_size * 2**30), int(config.hicache_storage_size * 2**30)
    if cache is None:
        raise ValueError("--enable-hierarchical-cache keeps the prefix cache's pages: it needs the radix cache "
                         "(drop --disable-radix-cache)")
    if config.hicache_storage_backend not in (None, "file"):
        raise ValueError(f"--hicache-storage-backend {config.hicache_storage_backend!r}: only 'file' is built")
    for name, nbytes in (("hicache_size", host_bytes), ("hicache_storage_size", disk_bytes)):
        if not nbytes > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number of GiB, not {getattr(config, name)}")
    disk = None
    if config.hicache_storage_backend == "file":
        directory = config.hicache_storage_dir or os.path.join(os.path.expanduser("~"), ".cache", "rvascend",
                                                               "hicache")
        disk = DiskTier(directory, disk_bytes)
    # Queued writes share their tensors with the host tier: a long queue costs little memory,
    # and a write it drops is queued again when its page is next taken (`store`).
    tiers = CacheTiers(HostTier(host_bytes), disk, queue_jobs=1024)
    page_tokens = config.mamba_track_interval if cache.hybrid else DENSE_PAGE_TOKENS
    started = time.perf_counter()
    hicache = HierarchicalCache(tiers, pool, page_tokens, functools.partial(context_of, page_tokens))
    logging.info("hierarchical cache: pages of %d tokens, host %.1f GiB%s; the weights' fingerprint took %.2f s",
                 page_tokens, config.hicache_size,
                 f", files in {disk.directory} up to {config.hicache_storage_size:.1f} GiB" if disk else "",
                 time.perf_counter() - started)
    return hicache


class HierarchicalCache:
    def __init__(self, tiers: CacheTiers, pool: KVPool, page_tokens: int, context_of: Callable[[], str]) -> None:
        """`context_of()`: the tiers' context of the model's weights as they are now."""
        self.tiers = tiers
        self.pool = pool
        self.page_tokens = page_tokens
        self._context_of = context_of
        self.context = context_of()
        self.hybrid = pool.states is not None
        self.stored_pages = 0    # pages handed to the tiers (since start)
        self.loaded_tokens = 0   # prompt tokens loaded back instead of prefilled
        self.load_failures = 0   # entries that did not fit the pool (a bug or a foreign file): misses

    # -- keys ------------------------------------------------------------------------
    def page_keys(self, tokens: list[int]) -> list[EntryKey]:
        """The keys of the whole pages of `tokens`, in order."""
        keys, context = [], self.context
        for end in range(self.page_tokens, len(tokens) + 1, self.page_tokens):
            key = EntryKey(context, tuple(tokens[end - self.page_tokens:end]))
            keys.append(key)
            context = key.digest
        return keys

    @staticmethod
    def states_key(page: EntryKey) -> EntryKey:
        """The key of the recurrent states after `page`'s last token."""
        return EntryKey(page.digest, ())

    # -- write-through ---------------------------------------------------------------
    def store(self, tokens: list[int], slots: list[int], states: dict[int, int]) -> None:
        """Copies the whole pages of `tokens` (K/V in `slots`) the tiers lack, and the
        snapshots `states` (prefix length -> state slot) that end a page."""
        for i, key in enumerate(self.page_keys(tokens)):
            end = (i + 1) * self.page_tokens
            if not self._everywhere(key):  # also where a full queue dropped an earlier disk write
                index = torch.tensor(slots[end - self.page_tokens:end], dtype=torch.long)
                entry = {}
                for layer, (k, v) in enumerate(zip(self.pool.k, self.pool.v)):
                    entry[f"k{layer}"], entry[f"v{layer}"] = k[index], v[index]  # gathers: copies
                self.tiers.put(key, entry)
                self.stored_pages += 1
            if self.hybrid and end in states and not self._everywhere(self.states_key(key)):
                slot = states[end]
                pool = self.pool.states
                entry = {f"conv{n}": c[slot].clone() for n, c in enumerate(pool.conv)}
                entry.update({f"ssm{n}": s[slot].clone() for n, s in enumerate(pool.ssm)})
                self.tiers.put(self.states_key(key), entry)

    def _everywhere(self, key: EntryKey) -> bool:
        """Whether every tier holds the entry (a disk write still queued counts as not)."""
        return all(tier is None or tier.contains(key) for tier in (self.tiers.host, self.tiers.disk))

    # -- read-back -------------------------------------------------------------------
    def _on_disk_only(self, tokens: list[int], have: int) -> list[EntryKey]:
        """The keys of `tokens`' pages past its first `have` tokens (and their snapshots) that
        are on disk and not in host memory, up to the first page in neither."""
        host, disk = self.tiers.host, self.tiers.disk
        if host is None or disk is None:
            return []
        keys = []
        for key in self.page_keys(tokens)[have // self.page_tokens:]:
            if not host.contains(key):
                if not disk.contains(key):
                    break
                keys.append(key)
            if self.hybrid:
                states = self.states_key(key)
                if not host.contains(states) and disk.contains(states):
                    keys.append(states)
        return keys

    def prefetch(self, tokens: list[int]) -> None:
        """Starts moving `tokens`' pages (and their snapshots) from disk to host memory on the
        tiers' thread."""
        self.tiers.prefetch(self._on_disk_only(tokens, 0))

    def read_in(self, tokens: list[int], have: int) -> None:
        """Moves `tokens`' pages past its first `have` tokens from disk to host memory now,
        on the caller's thread (the engine's, before admission takes the scheduler's lock, so
        that admission reads memory only)."""
        for key in self._on_disk_only(tokens, have):
            self.tiers.get(key)  # a disk hit is promoted into host

    def fetch(self, tokens: list[int], have: int) -> Optional[Loaded]:
        """The pages of `tokens` past its first `have` tokens (those the tree holds), read
        from the tiers up to the first missing one; a hybrid model's up to the last page
        whose end has a snapshot. None if they reach no further than `have`."""
        keys = self.page_keys(tokens)
        first = have // self.page_tokens
        reach = first
        while reach < len(keys) and self.tiers.contains(keys[reach]):
            reach += 1
        states = None
        if self.hybrid:
            while reach > first and not self.tiers.contains(self.states_key(keys[reach - 1])):
                reach -= 1
        page_shapes = self._page_shapes()
        while reach > first:
            if self.hybrid:
                states = self._checked(self.tiers.get(self.states_key(keys[reach - 1])), self._state_shapes())
                if states is None:
                    return None
            pages = [self._checked(self.tiers.get(k), page_shapes) for k in keys[first:reach]]
            if all(p is not None for p in pages):
                break
            # A page vanished between `contains` and `get` (evicted, or a bad file): the
            # pages before it still serve, a hybrid model's only up to a snapshot.
            reach = first + next(i for i, p in enumerate(pages) if p is None)
            if self.hybrid:
                return None
        if reach * self.page_tokens <= have:
            return None
        skip = have - first * self.page_tokens  # tokens of the first page the tree has already
        layers = range(len(self.pool.k))
        k = [torch.cat([p[f"k{n}"] for p in pages])[skip:] for n in layers]
        v = [torch.cat([p[f"v{n}"] for p in pages])[skip:] for n in layers]
        return Loaded(have, reach * self.page_tokens, k, v, states)

    def write(self, loaded: Loaded, slots: list[int], state_slot: Optional[int]) -> None:
        """Puts loaded K/V into pool `slots` (one per token from loaded.start) and its
        states into `state_slot`."""
        index = torch.tensor(slots, dtype=torch.long)
        for k, v, pk, pv in zip(loaded.k, loaded.v, self.pool.k, self.pool.v):
            pk[index] = k
            pv[index] = v
        if loaded.states is not None:
            pool = self.pool.states
            for n, c in enumerate(pool.conv):
                c[state_slot] = loaded.states[f"conv{n}"]
            for n, s in enumerate(pool.ssm):
                s[state_slot] = loaded.states[f"ssm{n}"]
        self.loaded_tokens += loaded.end - loaded.start

    def _page_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        shapes = {}
        for n, (k, v) in enumerate(zip(self.pool.k, self.pool.v)):
            shapes[f"k{n}"] = ((self.page_tokens, *k.shape[1:]), k.dtype)
            shapes[f"v{n}"] = ((self.page_tokens, *v.shape[1:]), v.dtype)
        return shapes

    def _state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        pool = self.pool.states
        shapes = {f"conv{n}": (tuple(c.shape[1:]), c.dtype) for n, c in enumerate(pool.conv)}
        shapes.update({f"ssm{n}": (tuple(s.shape[1:]), s.dtype) for n, s in enumerate(pool.ssm)})
        return shapes

    def _checked(self, entry: Optional[Tensors], shapes: dict) -> Optional[Tensors]:
        """The entry if its tensors are exactly the pool's (names, shapes, dtypes), else None."""
        if entry is None:
            return None
        if set(entry) != set(shapes) or any((tuple(t.shape), t.dtype) != shapes[name] for name, t in entry.items()):
            self.load_failures += 1
            logging.warning("hierarchical cache: an entry does not fit this model's pool; treated as a miss")
            return None
        return entry

    # -- upkeep -----------------------------------------------------------------------
    def weights_changed(self) -> None:
        """New weights: a new context (old entries miss), and the host tier's entries,
        which no key of the new context can reach, are dropped to make room."""
        self.context = self._context_of()
        if self.tiers.host is not None:
            self.tiers.host.flush()

    def stats(self) -> dict[str, float]:
        out = {"hicache_stored_pages": self.stored_pages, "hicache_loaded_tokens": self.loaded_tokens,
               "hicache_load_failures": self.load_failures}
        tiers = self.tiers.stats()
        for tier in ("host", "disk"):
            for field in ("entries", "bytes", "capacity_bytes", "hits", "misses", "evicted", "rejected",
                          "load_seconds"):
                if tier in tiers:
                    out[f"hicache_{tier}_{field}"] = tiers[tier][field]
        out["hicache_dropped_writes"] = tiers["dropped_writes"]
        return out

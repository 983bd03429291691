"""The KV cache's tiers beyond the in-memory pool: a bounded host-memory tier, then a directory on disk.

The pool (prefix_cache.py) keeps a prefix's K/V only while its slots last. The tiers
keep copies of its chunks (SGLang's HiCache host + file storage, LMCache): the host
tier in RAM, least recently used first out, and a disk tier that survives a server
restart, so a long system prompt is prefilled once per machine rather than once per
process. An entry is one chunk of a prefix's cache: named CPU tensors (K/V of some
tokens per layer, perhaps recurrent states) under an `EntryKey` that names the prefix
up to the chunk's end and everything that decides the bits (weights, dtype, kernel
route, deterministic mode, tokenizer, page size). Equal keys mean equal bits, so an
entry is never updated, only replaced.

`CacheTiers` is what the engine holds: `get` looks in host then disk (a disk hit is
promoted into host), `put` stores in host and hands the disk write to one
background thread through a bounded queue (a full queue drops the write: the engine
thread never waits on the disk), `prefetch` loads disk entries into host on that
thread so that the engine's later `get` is a memory hit.

The disk tier and its file format: disk_tier.py.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import queue
import threading
from typing import TYPE_CHECKING, Iterable, Optional

import numpy as np
import torch
from absl import logging

Tensors = dict[str, torch.Tensor]

if TYPE_CHECKING:
    from rvascend.engine.disk_tier import DiskTier

DTYPES = {name: getattr(torch, name) for name in ("bfloat16", "float16", "float32", "int8", "uint8", "int32", "int64")}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class EntryKey:
    """One chunk of a token prefix's cache. `context`: a hex digest of everything that
    decides the bits before the chunk's tokens; `tokens`: the chunk's (the hierarchical
    cache chains them: a page's context is the previous page's digest, so a key names the
    whole prefix)."""
    context: str
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))  # a list would make the key unhashable

    @functools.cached_property
    def tokens_sha256(self) -> str:
        """sha256 of the tokens as int64 little-endian, hex: what a file's header records."""
        return hashlib.sha256(_token_bytes(self.tokens)).hexdigest()

    @functools.cached_property
    def digest(self) -> str:
        """sha256 over the context and the tokens (int64 little-endian), hex: the entry's file name."""
        h = hashlib.sha256(self.context.encode("utf-8"))
        h.update(b"\0")  # the context is hex, so the separator cannot occur in it
        h.update(_token_bytes(self.tokens))
        return h.hexdigest()


def _token_bytes(tokens: tuple[int, ...]) -> bytes:
    return np.asarray(tokens, dtype="<i8").tobytes()


@dataclasses.dataclass
class TierStats:
    """One tier's counters; the same fields for both tiers so they export alike."""
    capacity_bytes: int
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0           # every get that returned None, rejected ones included
    evicted: int = 0          # entries removed to stay under the capacity
    refused: int = 0          # puts larger than the whole capacity
    rejected: int = 0         # disk: corrupt, foreign or stale files removed on read
    load_seconds: float = 0.0   # disk: reading and verifying entries
    write_seconds: float = 0.0  # disk: encoding, writing and fsyncing entries


def entry_nbytes(tensors: Tensors) -> int:
    """The tensors' bytes; raises ValueError for what no tier stores (a caller's bug,
    raised on the caller's thread rather than later in the writer)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"an entry is a dict of named tensors, not {type(tensors).__name__}")
    total = 0
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise ValueError(f"entry item {name!r}: names are str and values torch.Tensor, not {type(tensor).__name__}")
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, not one of {', '.join(DTYPES)}")
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; the tiers hold CPU tensors")
        total += tensor.numel() * tensor.element_size()
    return total


class HostTier:
    """Entries in RAM up to `capacity_bytes` of tensor data, least recently used out first."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"host tier capacity_bytes = {capacity_bytes} must be positive")
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, tuple[Tensors, int]] = collections.OrderedDict()  # LRU first
        self._stats = TierStats(capacity_bytes)

    def get(self, key: EntryKey) -> Optional[Tensors]:
        """The entry's tensors (shared with the tier: copy them, never write into them), or None."""
        with self._lock:
            entry = self._entries.get(key.digest)
            if entry is None:
                self._stats.misses += 1
                return None
            self._entries.move_to_end(key.digest)
            self._stats.hits += 1
            return dict(entry[0])

    def put(self, key: EntryKey, tensors: Tensors) -> bool:
        """Stores the entry, taking ownership of the tensors (nobody writes into them
        afterwards); evicts least recently used entries to fit. False: larger than the tier."""
        nbytes = entry_nbytes(tensors)
        with self._lock:
            if nbytes > self._stats.capacity_bytes:
                self._stats.refused += 1
                return False
            old = self._entries.pop(key.digest, None)
            if old is not None:
                self._stats.bytes -= old[1]
            self._entries[key.digest] = (dict(tensors), nbytes)
            self._stats.bytes += nbytes
            while self._stats.bytes > self._stats.capacity_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self._stats.bytes -= freed
                self._stats.evicted += 1
            self._stats.entries = len(self._entries)
            return True

    def contains(self, key: EntryKey) -> bool:
        """Whether the entry is here (does not count as a use)."""
        with self._lock:
            return key.digest in self._entries

    def flush(self) -> None:
        """Removes every entry."""
        with self._lock:
            self._entries.clear()
            self._stats.entries = self._stats.bytes = 0

    def stats(self) -> TierStats:
        with self._lock:
            return dataclasses.replace(self._stats)


@dataclasses.dataclass(frozen=True)
class _Job:
    key: EntryKey
    tensors: Optional[Tensors]  # None: a prefetch
    generation: int             # the flush count when queued: a job from before a flush is dropped


_STOP = object()


class CacheTiers:
    """The host tier, then the disk tier (either may be None), with one background thread
    for disk writes and prefetches. Thread-safe: the engine thread calls get/put/contains,
    the server thread stats/flush/prefetch."""

    def __init__(self, host: Optional[HostTier], disk: Optional[DiskTier], queue_jobs: int = 64) -> None:
        """`queue_jobs`: disk writes and prefetches waiting for the background thread; more are dropped."""
        self.host, self.disk = host, disk
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held by the background thread over one job; flush waits for it
        self._generation = 0
        self._dropped_writes = self._dropped_prefetches = 0
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=queue_jobs)
        self._thread = None
        if disk is not None:
            self._thread = threading.Thread(target=self._run, name="cache-tiers-disk", daemon=True)
            self._thread.start()

    def get(self, key: EntryKey) -> Optional[Tensors]:
        """The entry from host, else from disk (which blocks on the disk; promoted into host),
        else None. The tensors may be shared with the host tier: copy them, never write into them."""
        if self.host is not None:
            tensors = self.host.get(key)
            if tensors is not None:
                return tensors
        if self.disk is None:
            return None
        tensors = self.disk.get(key)
        if tensors is not None and self.host is not None:
            self.host.put(key, tensors)
        return tensors

    def put(self, key: EntryKey, tensors: Tensors) -> None:
        """Stores the entry in host and queues its disk write, taking ownership of the tensors
        (nobody writes into them afterwards). Never waits on the disk: a full queue drops the write."""
        entry_nbytes(tensors)
        if self.host is not None:
            self.host.put(key, tensors)
        if self.disk is not None:
            self._submit(key, dict(tensors))

    def contains(self, key: EntryKey) -> bool:
        return ((self.host is not None and self.host.contains(key))
                or (self.disk is not None and self.disk.contains(key)))

    def prefetch(self, keys: Iterable[EntryKey]) -> None:
        """Loads these entries from disk into host on the background thread, so that a later
        `get` is a memory hit. Keys not on disk are misses there; a full queue drops the rest."""
        if self.host is None or self.disk is None:
            return
        for key in keys:
            if not self.host.contains(key):
                self._submit(key, None)

    def flush(self) -> None:
        """Removes every entry of both tiers; queued writes and prefetches are dropped."""
        with self._lock:
            self._generation += 1
        with self._busy:  # a job already running finishes first, so nothing lands after the flush
            if self.host is not None:
                self.host.flush()
            if self.disk is not None:
                self.disk.flush()

    def drain(self) -> None:
        """Waits until every queued disk write and prefetch is done."""
        self._queue.join()

    def close(self) -> None:
        """Finishes the queued jobs and stops the background thread; later puts stay in host."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()

    def __enter__(self) -> CacheTiers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def queued_jobs(self) -> int:
        """Disk writes and prefetches waiting for the background thread."""
        return self._queue.qsize()

    def stats(self) -> dict:
        """{"host": TierStats fields, "disk": ..., (present tiers only), "dropped_writes",
        "dropped_prefetches", "queued_jobs"}."""
        out: dict = {}
        if self.host is not None:
            out["host"] = dataclasses.asdict(self.host.stats())
        if self.disk is not None:
            out["disk"] = dataclasses.asdict(self.disk.stats())
        with self._lock:
            out.update(dropped_writes=self._dropped_writes, dropped_prefetches=self._dropped_prefetches,
                       queued_jobs=self._queue.qsize())
        return out

    def _submit(self, key: EntryKey, tensors: Optional[Tensors]) -> None:
        with self._lock:
            try:
                if self._closed:
                    raise queue.Full
                self._queue.put_nowait(_Job(key, tensors, self._generation))
            except queue.Full:
                if tensors is None:
                    self._dropped_prefetches += 1
                else:
                    self._dropped_writes += 1

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is _STOP:
                    return
                with self._busy:
                    with self._lock:
                        current = job.generation == self._generation
                    if current:
                        self._run_job(job)
            except Exception:  # noqa: BLE001 - the one disk thread must outlive any one job
                logging.exception("cache tiers: background job for %s failed", job.key.digest)
            finally:
                self._queue.task_done()

    def _run_job(self, job: _Job) -> None:
        if job.tensors is not None:
            self.disk.put(job.key, job.tensors)
        elif not self.host.contains(job.key):
            tensors = self.disk.get(job.key)
            if tensors is not None:
                self.host.put(job.key, tensors)

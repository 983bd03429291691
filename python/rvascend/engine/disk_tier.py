"""The cache tiers' disk tier (cache_tiers.py): entries as files in a private directory
that outlives the process, least recently used out first.

Disk file format (one file per entry, `<key.digest>.kv`, all integers little-endian):

    magic      8 bytes   MAGIC
    version    u32       FORMAT_VERSION
    header_len u32       at most MAX_HEADER_BYTES
    header     header_len bytes of UTF-8 JSON: {"context", "tokens_sha256", "token_count",
               "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}
               (offsets relative to the payload, the tensors back to back in order)
    payload    each tensor's bytes, C order
    checksum   32 bytes: sha256 of everything above

Files are written to a uniquely named temp file in the same directory (pid +
random), fsynced, then `os.replace`d over the entry's name, so a reader (this
process or another server sharing the directory) sees a whole file or none.

Why the files are untrusted: a directory outlives the process that wrote it and can
be shared, copied, restored from a backup, filled by an older build or half-written
by a crash; a wrong tensor served from it would be silently wrong output, and an
unpickler would run code. So the format is raw bytes described by JSON (no pickle,
no torch.load); every size is checked before anything is allocated (header length,
declared sizes adding up to the file's size, the file no larger than the tier);
the checksum, the dtype whitelist and shapes agreeing with byte counts are verified;
the header's context and token hash must equal the key's (another model's or another
dtype's entry renamed to this digest is not this entry). The directory must be
private (mode 0700, owned by this uid): anyone who can write it can choose what the
server reads. Entry files are opened with O_NOFOLLOW and must be regular files.

A miss is any `get` that returns None: no file, or a file failing any check above.
A failing file is logged (absl warning naming the file and why), removed and
counted as rejected; the caller never sees an exception nor a tensor from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import stat
import struct
import threading
import time
from typing import BinaryIO, Iterator, Optional

import torch
from absl import logging

from rvascend.engine.cache_tiers import _DTYPE_NAMES, DTYPES, EntryKey, Tensors, TierStats, entry_nbytes

MAGIC = b"RVKVTIER"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sII")  # magic, version, header length in bytes
CHECKSUM_BYTES = 32  # sha256
MAX_HEADER_BYTES = 1 << 20  # thousands of tensors' descriptions; a larger claim is a bad file
MAX_DIMS = 16
STALE_TEMP_SECONDS = 3600.0  # a temp file this old belongs to a writer that crashed

ENTRY_SUFFIX = ".kv"
_ENTRY_FILE = re.compile(r"[0-9a-f]{64}\.kv")
_TEMP_FILE = re.compile(r"\.[0-9a-f]{64}\.[0-9]+\.[0-9a-f]+\.tmp")
_LOCK_FILE = ".lock"


class _CorruptEntry(Exception):
    """A file that is not a valid entry for the key asked for; the message says why."""


# What reading an untrusted file can raise: each is a miss. ValueError covers bad JSON and
# UTF-8, RuntimeError torch's and RecursionError (deeply nested JSON).
_READ_ERRORS = (_CorruptEntry, OSError, ValueError, RuntimeError, TypeError, OverflowError)

_mtime_lock = threading.Lock()
_last_mtime_ns = 0


def _next_mtime_ns() -> int:
    """Now, strictly after this process's previous answer: mtimes are the disk tier's
    LRU order, and file timestamps can be as coarse as a kernel tick."""
    global _last_mtime_ns
    with _mtime_lock:
        _last_mtime_ns = max(time.time_ns(), _last_mtime_ns + 1)
        return _last_mtime_ns


def _unlink_quietly(path: str) -> bool:
    """Removes the file; False if it was already gone (another server evicted it)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as error:  # a directory or a file the server may not remove, planted under an entry's name
        logging.warning("cache tiers: cannot remove %s: %s", path, error)
        return False


@contextlib.contextmanager
def _directory_lock(directory: str) -> Iterator[None]:
    """An exclusive flock on the directory's lock file: two servers sharing the
    directory scan and evict one at a time (flock also excludes a second open in
    this process, so two DiskTier objects exclude each other too)."""
    fd = os.open(os.path.join(directory, _LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _make_private_directory(path: str) -> None:
    """Creates `path` with mode 0700, or checks an existing one is as private: whoever
    can write the directory chooses what the server reads."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):  # whoever can re-point the link chooses the directory later
        raise ValueError(f"cache directory {path} is a symbolic link; give the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"cache directory {path} is not a directory")
    uid = os.geteuid()
    if info.st_uid != uid:
        raise ValueError(f"cache directory {path} is owned by uid {info.st_uid}, not by the current uid {uid}: "
                         "its owner could plant entries the server would read")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ValueError(f"cache directory {path} has mode {mode:#o}: group/other may access it; "
                         f"it must be private (chmod 700 {path})")


def _read_exact(f: BinaryIO, nbytes: int) -> bytearray:
    """The next `nbytes` of `f` in a fresh buffer; `nbytes` is already bounded by the file's size."""
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    filled = 0
    while filled < nbytes:
        got = f.readinto(view[filled:])
        if not got:
            raise _CorruptEntry(f"the file ends {nbytes - filled} bytes early")
        filled += got
    return buffer


def _expect(condition: bool, reason: str) -> None:
    if not condition:
        raise _CorruptEntry(reason)


def _is_int(value: object) -> bool:
    return type(value) is int  # JSON true/false are bools, which isinstance(int) would pass


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


def _parse_tensor_spec(index: int, item: object, offset: int) -> _TensorSpec:
    """Header entry `index`, which must start at payload `offset`."""
    _expect(isinstance(item, dict), f"tensors[{index}] is not a JSON object")
    name, dtype_name, shape = item.get("name"), item.get("dtype"), item.get("shape")
    _expect(isinstance(name, str), f"tensors[{index}] has no string name")
    _expect(isinstance(dtype_name, str) and dtype_name in DTYPES,
            f"tensor {name!r}: dtype {dtype_name!r} is not one of {', '.join(DTYPES)}")
    _expect(isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) and d >= 0 for d in shape),
            f"tensor {name!r}: shape {str(shape)[:80]} is not a list of at most {MAX_DIMS} sizes >= 0")
    dtype = DTYPES[dtype_name]
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot overflow past the checks
    _expect(item.get("nbytes") == nbytes and _is_int(item.get("nbytes")),
            f"tensor {name!r}: nbytes {item.get('nbytes')!r} is not shape {shape} x {dtype.itemsize} bytes = {nbytes}")
    _expect(item.get("offset") == offset and _is_int(item.get("offset")),
            f"tensor {name!r}: offset {item.get('offset')!r} is not {offset} (tensors lie back to back)")
    return _TensorSpec(name, dtype, tuple(shape), nbytes)


def _parse_header(raw: bytes, payload_bytes: int) -> tuple[dict, list[_TensorSpec]]:
    """The header and its tensors, whose sizes must add up to `payload_bytes` (what the
    file holds between the header and the checksum) before any payload is read."""
    header = json.loads(raw.decode("utf-8"))
    _expect(isinstance(header, dict), "the header is not a JSON object")
    _expect(isinstance(header.get("context"), str) and isinstance(header.get("tokens_sha256"), str)
            and _is_int(header.get("token_count")), "the header lacks context, tokens_sha256 or token_count")
    items = header.get("tensors")
    _expect(isinstance(items, list), "the header's tensors is not a list")
    specs, offset = [], 0
    for index, item in enumerate(items):
        spec = _parse_tensor_spec(index, item, offset)
        specs.append(spec)
        offset += spec.nbytes
    _expect(len({spec.name for spec in specs}) == len(specs), "two tensors share a name")
    _expect(offset == payload_bytes, f"the tensors declare {offset} bytes but the file holds {payload_bytes}")
    return header, specs


def _read_entry(f: BinaryIO, file_bytes: int, key: EntryKey, capacity_bytes: int) -> Tensors:
    """The entry in `f` (a `file_bytes` long file), verified for `key`; raises one of
    _READ_ERRORS naming the first problem. Sizes are checked before each allocation."""
    _expect(file_bytes <= capacity_bytes, f"{file_bytes} bytes is more than the tier's capacity of {capacity_bytes}")
    _expect(file_bytes >= PREFIX.size + CHECKSUM_BYTES, f"{file_bytes} bytes is shorter than any entry")
    prefix = _read_exact(f, PREFIX.size)
    magic, version, header_bytes = PREFIX.unpack(prefix)
    _expect(magic == MAGIC, f"magic {bytes(magic)!r} is not {MAGIC!r}")
    _expect(version == FORMAT_VERSION, f"format version {version} is not {FORMAT_VERSION}")
    _expect(header_bytes <= MAX_HEADER_BYTES, f"header length {header_bytes} is over {MAX_HEADER_BYTES}")
    payload_bytes = file_bytes - PREFIX.size - header_bytes - CHECKSUM_BYTES
    _expect(payload_bytes >= 0, f"header length {header_bytes} does not fit a {file_bytes} byte file")
    raw_header = _read_exact(f, header_bytes)
    header, specs = _parse_header(bytes(raw_header), payload_bytes)
    checksum = hashlib.sha256(prefix)
    checksum.update(raw_header)
    tensors = {}
    for spec in specs:
        # One buffer per tensor, so each owns its memory and none aliases the file.
        data = _read_exact(f, spec.nbytes)
        checksum.update(data)
        tensors[spec.name] = (torch.frombuffer(data, dtype=spec.dtype).reshape(spec.shape) if spec.nbytes
                              else torch.empty(spec.shape, dtype=spec.dtype))
    _expect(bytes(_read_exact(f, CHECKSUM_BYTES)) == checksum.digest(), "checksum mismatch (a changed or torn file)")
    # Identity last: a valid file of another context or prefix is named as such, not as corrupt.
    _expect(header["context"] == key.context,
            f"context {header['context'][:16]!r}... is not the key's {key.context[:16]!r}... "
            "(another model's or setting's entry)")
    _expect(header["tokens_sha256"] == key.tokens_sha256 and header["token_count"] == len(key.tokens),
            f"the file's {header['token_count']} token prefix is not the key's {len(key.tokens)} (a renamed entry)")
    return tensors


def _encode_entry(key: EntryKey, tensors: Tensors) -> tuple[list[bytes | memoryview], int]:
    """The file's chunks (checksum not included) and the whole file's size in bytes."""
    items, payload, offset = [], [], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        items.append({"name": name, "dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                      "offset": offset, "nbytes": nbytes})
        # Bytes of any dtype through a uint8 view: numpy has no bfloat16.
        payload.append(memoryview(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
        offset += nbytes
    header = json.dumps({"context": key.context, "tokens_sha256": key.tokens_sha256, "token_count": len(key.tokens),
                         "tensors": items}, separators=(",", ":")).encode("utf-8")
    chunks = [PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header, *payload]
    return chunks, PREFIX.size + len(header) + offset + CHECKSUM_BYTES


class DiskTier:
    """Entries as files in a private `directory`, at most `capacity_bytes` of files,
    least recently used (oldest mtime) out first. Several DiskTier objects or processes
    may share the directory."""

    def __init__(self, directory: str, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"disk tier capacity_bytes = {capacity_bytes} must be positive")
        # Resolved once: a parent re-pointed later does not move the tier (a link as the directory
        # itself is refused).
        self.directory = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(directory))),
                                      os.path.basename(os.path.abspath(directory)))
        _make_private_directory(self.directory)
        self._lock = threading.Lock()
        self._stats = TierStats(capacity_bytes)
        self._evict(keep=None)  # a smaller capacity than last run's, temp files of a crashed writer

    def path(self, key: EntryKey) -> str:
        """The entry's file."""
        return os.path.join(self.directory, key.digest + ENTRY_SUFFIX)

    def get(self, key: EntryKey) -> Optional[Tensors]:
        """The entry's tensors in fresh memory, or None (absent, or a bad file: removed and counted)."""
        path = self.path(key)
        start = time.perf_counter()
        try:
            # O_NONBLOCK: a FIFO planted under the name must not hang the open.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except OSError as error:
            self._reject(path, None, f"cannot open it: {error}")
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a directory or a device planted under the name
            os.close(fd)
            self._reject(path, info.st_ino, "not a regular file")
            return None
        with os.fdopen(fd, "rb", buffering=0) as f:
            try:
                tensors = _read_entry(f, info.st_size, key, self._stats.capacity_bytes)
            except _READ_ERRORS as error:
                self._reject(path, info.st_ino, str(error) or type(error).__name__)
                return None
            finally:
                self._count(load_seconds=time.perf_counter() - start)
        self._touch(path)
        self._count(hits=1)
        return tensors

    def put(self, key: EntryKey, tensors: Tensors) -> bool:
        """Writes the entry (atomically) and evicts to stay under the capacity. False: larger
        than the tier, or the write failed (logged). An entry already on disk is only touched:
        equal keys hold equal bits."""
        if entry_nbytes(tensors) > self._stats.capacity_bytes:
            self._count(refused=1)
            return False
        path = self.path(key)
        if os.path.exists(path) and self._touch(path):
            return True
        start = time.perf_counter()
        chunks, file_bytes = _encode_entry(key, tensors)
        if file_bytes > self._stats.capacity_bytes:
            self._count(refused=1)
            return False
        try:
            self._write_atomically(path, chunks)
        except OSError as error:
            logging.warning("cache tiers: cannot write %s: %s", path, error)
            return False
        finally:
            self._count(write_seconds=time.perf_counter() - start)
        self._evict(keep=os.path.basename(path))
        return True

    def contains(self, key: EntryKey) -> bool:
        """Whether the entry's file exists (a `get` may still find it bad)."""
        return os.path.exists(self.path(key))

    def flush(self) -> None:
        """Removes every entry file in the directory (nothing else there)."""
        try:
            with _directory_lock(self.directory):
                for name in os.listdir(self.directory):
                    if _ENTRY_FILE.fullmatch(name):
                        _unlink_quietly(os.path.join(self.directory, name))
        except OSError as error:  # the directory removed or made unusable under the server
            logging.warning("cache tiers: cannot flush %s: %s", self.directory, error)

    def stats(self) -> TierStats:
        """Counters of this object; entries and bytes are the directory's now (all writers')."""
        files = self._scan(clean_temps=False)
        with self._lock:
            return dataclasses.replace(self._stats, entries=len(files), bytes=sum(size for _, _, size in files))

    def _write_atomically(self, path: str, chunks: list[bytes | memoryview]) -> None:
        # pid + random: two servers (or two objects) writing the same key never share a temp file.
        temp = os.path.join(self.directory, f".{os.path.basename(path)[:64]}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                checksum = hashlib.sha256()
                for chunk in chunks:
                    checksum.update(chunk)
                    f.write(chunk)
                f.write(checksum.digest())
                f.flush()
                os.fsync(f.fileno())
            now = _next_mtime_ns()
            os.utime(temp, ns=(now, now))
            # No fsync of the directory: losing a rename in a power cut only loses a cache entry.
            os.replace(temp, path)
        except BaseException:
            _unlink_quietly(temp)
            raise

    def _touch(self, path: str) -> bool:
        """Marks a use (the mtime is the LRU order); False if the file is gone."""
        now = _next_mtime_ns()
        try:
            os.utime(path, ns=(now, now))
            return True
        except FileNotFoundError:
            return False

    def _scan(self, clean_temps: bool) -> list[tuple[int, str, int]]:
        """(mtime ns, name, bytes) of every entry file; removes temp files older than
        STALE_TEMP_SECONDS when `clean_temps`. Files vanishing meanwhile are skipped."""
        files = []
        stale_before_ns = time.time_ns() - int(STALE_TEMP_SECONDS * 1e9)
        try:
            it = os.scandir(self.directory)
        except OSError as error:  # removed under the server: no entries (writes fail and are logged)
            logging.warning("cache tiers: cannot list %s: %s", self.directory, error)
            return files
        with it:
            for entry in it:
                is_entry = _ENTRY_FILE.fullmatch(entry.name)
                if not is_entry and not (clean_temps and _TEMP_FILE.fullmatch(entry.name)):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue  # not an entry, whatever its name (a reader rejects it too)
                if is_entry:
                    files.append((info.st_mtime_ns, entry.name, info.st_size))
                elif info.st_mtime_ns < stale_before_ns:
                    logging.info("cache tiers: removing %s, left by a writer that stopped", entry.path)
                    _unlink_quietly(entry.path)
        return files

    def _evict(self, keep: Optional[str]) -> None:
        """Removes least recently used entry files until the directory is under the capacity,
        never `keep` (the file just written, which a coarse clock may date as old as others)."""
        evicted = 0
        try:
            with _directory_lock(self.directory):
                files = sorted(self._scan(clean_temps=True))
                total = sum(size for _, _, size in files)
                for _, name, size in files:
                    if total <= self._stats.capacity_bytes:
                        break
                    if name == keep:
                        continue
                    evicted += _unlink_quietly(os.path.join(self.directory, name))
                    total -= size  # gone either way: removed here or by another server
        except OSError as error:  # the directory (or its lock file) made unusable under the server
            logging.warning("cache tiers: cannot evict in %s: %s", self.directory, error)
        self._count(evicted=evicted)

    def _reject(self, path: str, inode: Optional[int], reason: str) -> None:
        logging.warning("cache tiers: dropping disk entry %s: %s", path, reason)
        self._count(misses=1, rejected=1)
        try:
            # Only the file that was read: another server may have replaced it with a good one since.
            if inode is None or os.lstat(path).st_ino == inode:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            logging.warning("cache tiers: cannot remove %s: %s", path, error)

    def _count(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)

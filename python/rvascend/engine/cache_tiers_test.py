"""The cache tiers alone: round trips, LRU by bytes, restarts, hostile files, private
directories, two servers on one directory, the background writer and prefetch."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import random
import re
import struct
import threading
import time
from typing import Optional

import pytest
import torch

from rvascend.engine import disk_tier
from rvascend.engine.cache_tiers import CacheTiers, EntryKey, HostTier
from rvascend.engine.disk_tier import DiskTier

CONTEXT = "ab" * 32
OTHER_CONTEXT = "cd" * 32  # another model's weights, or the same model in another dtype
MiB = 1 << 20


def make_key(*tokens: int, context: str = CONTEXT) -> EntryKey:
    return EntryKey(context, tokens)


def entry_for(key: EntryKey, elements: int = 256) -> dict[str, torch.Tensor]:
    """Tensors that are a function of the key: any tensor served for a key can be checked."""
    generator = torch.Generator().manual_seed(int(key.digest[:15], 16))
    return {"k0": torch.randn(elements, generator=generator),
            "v0": torch.randn(elements // 2, generator=generator).to(torch.bfloat16)}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_same_entry(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got is not None
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(bits(got[name]), bits(tensor)), name


def file_size_of(directory, entry: dict[str, torch.Tensor]) -> int:
    """The bytes one entry's file takes (all test entries of one shape share it)."""
    scratch = DiskTier(str(directory), 64 * MiB)
    key = make_key(0)
    scratch.put(key, entry)
    return os.path.getsize(scratch.path(key))


def entry_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(disk_tier.ENTRY_SUFFIX))


# The key and EntryKey.


def test_digest_is_sha256_of_the_context_and_int64_little_endian_tokens():
    key = EntryKey(CONTEXT, [1, 2, 70000])
    assert key.tokens == (1, 2, 70000) and hash(key) == hash(make_key(1, 2, 70000))
    token_bytes = struct.pack("<3q", 1, 2, 70000)
    assert key.digest == hashlib.sha256(CONTEXT.encode() + b"\0" + token_bytes).hexdigest()
    assert key.tokens_sha256 == hashlib.sha256(token_bytes).hexdigest()
    assert make_key(1, 2, 70000, context=OTHER_CONTEXT).digest != key.digest
    assert make_key(1, 2).digest != key.digest


def test_put_refuses_what_no_tier_stores():
    tiers = CacheTiers(HostTier(MiB), None)
    with pytest.raises(ValueError, match="'x' has dtype torch.complex64"):
        tiers.put(make_key(1), {"x": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="'y'"):
        tiers.put(make_key(1), {"y": [1, 2]})
    with pytest.raises(ValueError, match="dict of named tensors"):
        tiers.put(make_key(1), [torch.zeros(2)])


# Round trips.


def every_dtype_entry() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    # Random bit patterns: bfloat16/float16 NaN payloads, -0.0 and subnormals must survive too.
    random16 = torch.randint(-2**15, 2**15, (3, 5, 7), dtype=torch.int16, generator=generator)
    return {
        "bf16": random16.view(torch.bfloat16),
        "f16": random16.flip(0).contiguous().view(torch.float16),
        "f32": torch.randint(-2**31, 2**31 - 1, (4, 9), dtype=torch.int32, generator=generator).view(torch.float32),
        "i8": torch.randint(-128, 128, (33,), dtype=torch.int8, generator=generator),
        "u8": torch.randint(0, 256, (2, 2, 2, 2), dtype=torch.uint8, generator=generator),
        "i32": torch.randint(-2**31, 2**31 - 1, (6,), dtype=torch.int32, generator=generator),
        "i64": torch.tensor([-2**63, 2**63 - 1, 0, 12345], dtype=torch.int64),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 8, dtype=torch.float32),
        "strided": torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),  # stored contiguous, same values
    }


def test_disk_round_trip_is_bit_exact_for_every_dtype(tmp_path):
    want = every_dtype_entry()
    key = make_key(3, 1, 4, 1, 5)
    DiskTier(str(tmp_path), 64 * MiB).put(key, want)
    got = DiskTier(str(tmp_path), 64 * MiB).get(key)
    assert_same_entry(got, want)
    assert torch.equal(got["bf16"].view(torch.int16), want["bf16"].view(torch.int16))


def test_disk_reads_are_fresh_writable_memory(tmp_path):
    tier = DiskTier(str(tmp_path), 64 * MiB)
    key = make_key(1, 2)
    want = entry_for(key)
    tier.put(key, want)
    first, second = tier.get(key), tier.get(key)
    assert first["k0"].data_ptr() != second["k0"].data_ptr()
    first["k0"].zero_()
    assert_same_entry(second, want)
    with open(tier.path(key), "r+b") as f:  # the file changing later changes no tensor already read
        f.write(b"\0" * 64)
    assert_same_entry(second, want)


# LRU by bytes.


def test_host_tier_evicts_least_recently_used_by_bytes():
    a, b, c, d = (make_key(i) for i in range(4))
    entry_bytes = 256 * 4 + 128 * 2
    host = HostTier(3 * entry_bytes)
    for key in (a, b, c):
        assert host.put(key, entry_for(key))
    assert_same_entry(host.get(a), entry_for(a))  # a is now the most recent; b the least
    host.put(d, entry_for(d))
    assert [host.contains(k) for k in (a, b, c, d)] == [True, False, True, True]
    stats = host.stats()
    assert (stats.entries, stats.bytes, stats.evicted, stats.hits) == (3, 3 * entry_bytes, 1, 1)
    assert host.get(b) is None and host.stats().misses == 1
    assert not host.put(make_key(9), {"big": torch.zeros(3 * entry_bytes + 1, dtype=torch.uint8)})
    assert host.stats().refused == 1 and host.stats().entries == 3
    host.put(a, {"small": torch.zeros(4, dtype=torch.uint8)})  # replacing an entry replaces its bytes
    assert host.stats().bytes == 2 * entry_bytes + 4


def test_disk_tier_evicts_least_recently_used_by_bytes(tmp_path):
    a, b, c = (make_key(i, 1) for i in range(3))
    size = file_size_of(tmp_path / "scratch", entry_for(a))
    tier = DiskTier(str(tmp_path / "tier"), 2 * size + size // 2)
    tier.put(a, entry_for(a))
    tier.put(b, entry_for(b))
    assert tier.get(a) is not None  # a hit touches a: b becomes the least recently used
    tier.put(c, entry_for(c))
    assert [tier.contains(k) for k in (a, b, c)] == [True, False, True]
    stats = tier.stats()
    assert (stats.entries, stats.bytes, stats.evicted) == (2, 2 * size, 1)
    assert_same_entry(tier.get(c), entry_for(c))
    huge = make_key(7)
    assert not tier.put(huge, {"big": torch.zeros(3 * size, dtype=torch.uint8)})
    assert not tier.contains(huge) and tier.stats().refused == 1


def test_the_entry_just_written_survives_its_own_eviction(tmp_path, monkeypatch):
    # A coarse clock (or another server's) can date every file alike; the new entry must stay.
    monkeypatch.setattr(disk_tier, "_next_mtime_ns", lambda: 10**18)
    keys = sorted((make_key(i) for i in range(2)), key=lambda k: k.digest, reverse=True)  # new one sorts first
    size = file_size_of(tmp_path / "scratch", entry_for(keys[0]))
    tier = DiskTier(str(tmp_path / "tier"), size + size // 2)
    for key in keys:
        assert tier.put(key, entry_for(key))
    assert [tier.contains(k) for k in keys] == [False, True]


def test_host_eviction_keeps_the_disk_copy(tmp_path):
    a, b = make_key(1), make_key(2)
    entry_bytes = 256 * 4 + 128 * 2
    with CacheTiers(HostTier(entry_bytes), DiskTier(str(tmp_path), 64 * MiB)) as tiers:
        tiers.put(a, entry_for(a))
        tiers.put(b, entry_for(b))
        tiers.drain()
        assert not tiers.host.contains(a) and tiers.contains(a)
        assert_same_entry(tiers.get(a), entry_for(a))
        stats = tiers.stats()
        assert stats["disk"]["hits"] == 1 and stats["host"]["misses"] == 1
        assert tiers.host.contains(a)  # promoted: the next get is a memory hit
        tiers.get(a)
        assert tiers.stats()["host"]["hits"] == 1 and tiers.stats()["disk"]["hits"] == 1


# Restarts.


def test_a_new_disk_tier_on_the_directory_finds_the_entry(tmp_path):
    key = make_key(5, 6, 7)
    DiskTier(str(tmp_path), 64 * MiB).put(key, entry_for(key))
    restarted = DiskTier(str(tmp_path), 64 * MiB)
    assert restarted.stats().entries == 1
    assert_same_entry(restarted.get(key), entry_for(key))
    assert restarted.stats().hits == 1 and restarted.stats().rejected == 0


def test_a_smaller_capacity_after_a_restart_evicts_at_once(tmp_path):
    keys = [make_key(i) for i in range(4)]
    tier = DiskTier(str(tmp_path), 64 * MiB)
    for key in keys:
        tier.put(key, entry_for(key))
    size = os.path.getsize(tier.path(keys[0]))
    smaller = DiskTier(str(tmp_path), 2 * size)
    assert smaller.stats().entries == 2 and [smaller.contains(k) for k in keys] == [False, False, True, True]


def test_temp_files_of_a_crashed_writer_are_cleaned(tmp_path):
    digest = "0" * 64
    old = tmp_path / f".{digest}.4242.deadbeef.tmp"
    fresh = tmp_path / f".{digest}.4243.cafe.tmp"  # perhaps another server's write in progress
    unrelated = tmp_path / "notes.txt"
    for path in (old, fresh, unrelated):
        path.write_bytes(b"partial")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(old, (two_hours_ago, two_hours_ago))
    os.chmod(tmp_path, 0o700)
    DiskTier(str(tmp_path), MiB)
    assert not old.exists() and fresh.exists() and unrelated.exists()


# Hostile files: each is a miss, removed, counted, logged, and nothing is allocated
# beyond the file's size.


def _prefix_and_header(path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        magic, version, header_len = struct.unpack("<8sII", f.read(16))
        return header_len, json.loads(f.read(header_len))


def write_raw(path, header: dict, payload: bytes, header_bytes=None, version: int = disk_tier.FORMAT_VERSION):
    """A file with a valid checksum, written from the format as documented."""
    raw = json.dumps(header).encode() if header_bytes is None else header_bytes
    body = struct.pack("<8sII", disk_tier.MAGIC, version, len(raw)) + raw + payload
    with open(path, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())


def crafted_header(key: EntryKey, tensors: list[dict]) -> dict:
    return {"context": key.context, "tokens_sha256": key.tokens_sha256, "token_count": len(key.tokens),
            "tensors": tensors}


def truncate_end(path, key, tier):
    os.truncate(path, os.path.getsize(path) - 1)


def truncate_half(path, key, tier):
    os.truncate(path, os.path.getsize(path) // 2)


def flip_payload_byte(path, key, tier):
    header_len, _ = _prefix_and_header(path)
    _flip(path, 16 + header_len + 100)


def flip_checksum_byte(path, key, tier):
    _flip(path, os.path.getsize(path) - 5)


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def edit_header_keeping_it_valid(path, key, tier):
    # A header still well formed (same length, a tensor renamed): only the checksum can tell.
    data = open(path, "rb").read()
    assert data.count(b'"k0"') == 1
    open(path, "wb").write(data.replace(b'"k0"', b'"j0"'))


def rename_other(path, key, other_key, tensors, tier):
    tier.put(other_key, tensors)
    os.replace(tier.path(other_key), path)


def another_models_entry(path, key, tier):
    other = make_key(*key.tokens, context=OTHER_CONTEXT)
    rename_other(path, key, other, entry_for(key), tier)


def another_dtypes_entry(path, key, tier):
    # The engine puts the dtype into the context: the float16 run's entry has another one.
    other = make_key(*key.tokens, context="ef" * 32)
    rename_other(path, key, other, {n: t.to(torch.float16) for n, t in entry_for(key).items()}, tier)


def another_prefixs_entry(path, key, tier):
    other = make_key(*key.tokens, 99)
    rename_other(path, key, other, entry_for(other), tier)


def garbage(path, key, tier):
    open(path, "wb").write(random.Random(1).randbytes(4096))


def absurd_header_length(path, key, tier):
    with open(path, "wb") as f:
        f.write(struct.pack("<8sII", disk_tier.MAGIC, disk_tier.FORMAT_VERSION, 2**32 - 1) + b"{}" * 100)


def header_length_past_the_file(path, key, tier):
    with open(path, "wb") as f:
        f.write(struct.pack("<8sII", disk_tier.MAGIC, disk_tier.FORMAT_VERSION, 5000) + b"{}" * 100)


def huge_declared_shape(path, key, tier):
    shape = [2**40, 2**40]
    write_raw(path, crafted_header(key, [{"name": "k0", "dtype": "float32", "shape": shape, "offset": 0,
                                          "nbytes": 4 * 2**80}]), b"\0" * 64)


def shape_disagreeing_with_nbytes(path, key, tier):
    # The payload fits the shape; the declared nbytes does not: an inconsistent writer.
    write_raw(path, crafted_header(key, [{"name": "k0", "dtype": "float32", "shape": [4], "offset": 0,
                                          "nbytes": 8}]), b"\0" * 16)


def header_over_the_limit(path, key, tier):
    # A valid entry but for a header padded (JSON whitespace) past MAX_HEADER_BYTES.
    tensors = entry_for(key)
    specs, payload = [], b""
    for name, tensor in tensors.items():
        specs.append({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                      "offset": len(payload), "nbytes": tensor.numel() * tensor.element_size()})
        payload += bits(tensor).numpy().tobytes()
    header = json.dumps(crafted_header(key, specs)).encode() + b" " * disk_tier.MAX_HEADER_BYTES
    write_raw(path, {}, payload, header_bytes=header)


def negative_dimension(path, key, tier):
    write_raw(path, crafted_header(key, [{"name": "k0", "dtype": "float32", "shape": [-2, -2], "offset": 0,
                                          "nbytes": 16}]), b"\0" * 16)


def dtype_not_whitelisted(path, key, tier):
    write_raw(path, crafted_header(key, [{"name": "k0", "dtype": "complex64", "shape": [2], "offset": 0,
                                          "nbytes": 16}]), b"\0" * 16)


def overlapping_offsets(path, key, tier):
    spec = {"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}
    write_raw(path, crafted_header(key, [dict(spec, name="a"), dict(spec, name="b")]), b"\0" * 16)


def deeply_nested_header(path, key, tier):
    write_raw(path, {}, b"", header_bytes=b"[" * 200000 + b"]" * 200000)


def header_not_json(path, key, tier):
    write_raw(path, {}, b"", header_bytes=b"\xff\xfe not json")


def future_version(path, key, tier):
    write_raw(path, crafted_header(key, []), b"", version=disk_tier.FORMAT_VERSION + 1)


def symlink(path, key, tier):
    os.replace(path, path + ".moved")
    os.symlink(path + ".moved", path)


def fifo(path, key, tier):
    os.unlink(path)
    os.mkfifo(path)


# Each fault and the reason its log line must give: the check meant for it caught it.
FAULTS = {
    truncate_end: "the tensors declare", truncate_half: "the tensors declare|does not fit",
    flip_payload_byte: "checksum mismatch", flip_checksum_byte: "checksum mismatch",
    edit_header_keeping_it_valid: "checksum mismatch", another_models_entry: "another model's",
    another_dtypes_entry: "another model's", another_prefixs_entry: "renamed entry", garbage: "magic",
    absurd_header_length: "header length 4294967295 is over", header_length_past_the_file: "does not fit",
    header_over_the_limit: "is over 1048576", huge_declared_shape: "the tensors declare",
    shape_disagreeing_with_nbytes: "nbytes 8 is not shape", negative_dimension: "is not a list of",
    dtype_not_whitelisted: "dtype 'complex64' is not one of", overlapping_offsets: "offset 0 is not 8",
    deeply_nested_header: "recursion", header_not_json: "can't decode", future_version: "format version 2 is not 1",
    symlink: "cannot open", fifo: "not a regular file",
}


@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__ for f in FAULTS])
def test_a_bad_file_is_a_counted_logged_miss_and_is_removed(tmp_path, monkeypatch, caplog, fault):
    key = make_key(10, 20, 30)
    tier = DiskTier(str(tmp_path), 64 * MiB)
    tier.put(key, entry_for(key))
    path = tier.path(key)
    fault(path, key, tier)
    file_bytes = os.lstat(path).st_size
    requested = []
    read_exact = disk_tier._read_exact
    monkeypatch.setattr(disk_tier, "_read_exact", lambda f, n: requested.append(n) or read_exact(f, n))
    reader = DiskTier(str(tmp_path), 64 * MiB)  # a restarted server meets the bad file
    with caplog.at_level(logging.WARNING):
        assert reader.get(key) is None
    assert not os.path.lexists(path)
    stats = reader.stats()
    assert (stats.rejected, stats.misses, stats.hits) == (1, 1, 0)
    assert sum(requested) <= file_bytes, f"read buffers of {requested} bytes for a {file_bytes} byte file"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(path in message and re.search(FAULTS[fault], message) for message in warnings), warnings
    # The key works again once a good entry is written.
    reader.put(key, entry_for(key))
    assert_same_entry(reader.get(key), entry_for(key))


def test_a_file_larger_than_the_readers_capacity_is_refused_before_reading(tmp_path, monkeypatch):
    key = make_key(1)
    small = DiskTier(str(tmp_path), MiB // 2)  # two servers with different bounds on one directory
    DiskTier(str(tmp_path), 64 * MiB).put(key, {"big": torch.zeros(MiB, dtype=torch.uint8)})
    monkeypatch.setattr(disk_tier, "_read_exact", lambda f, n: pytest.fail("read a file over the capacity"))
    assert small.get(key) is None and small.stats().rejected == 1
    assert not small.contains(key)


def test_a_missing_file_is_a_plain_miss(tmp_path):
    tier = DiskTier(str(tmp_path), MiB)
    assert tier.get(make_key(1)) is None
    assert (tier.stats().misses, tier.stats().rejected) == (1, 0)


# The directory is private.


def test_the_directory_is_created_private(tmp_path):
    directory = tmp_path / "a" / "cache"
    DiskTier(str(directory), MiB)
    assert os.stat(directory).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_directory_others_can_reach_is_refused(tmp_path, mode):
    directory = tmp_path / "cache"
    directory.mkdir()
    os.chmod(directory, mode)
    with pytest.raises(ValueError, match=f"{directory} has mode {mode:#o}: group/other may access it"):
        DiskTier(str(directory), MiB)


def another_mapped_uid() -> Optional[int]:
    """A uid other than ours that chown can give a file here (in a user namespace, as
    under Bazel's sandbox, only the uids /proc/self/uid_map lists exist), or None."""
    try:
        with open("/proc/self/uid_map", encoding="ascii") as f:
            ranges = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        ranges = [(0, 0, 2**32 - 1)]
    for inside, _, count in ranges:
        for uid in (65534, inside, inside + count - 1):
            if inside <= uid < inside + count and uid != os.geteuid():
                return uid
    return None


def test_a_directory_owned_by_someone_else_is_refused(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    uid = another_mapped_uid()
    try:
        if uid is None:
            raise PermissionError("no other uid is mapped")
        os.chown(directory, uid, -1)
    except PermissionError as error:
        pytest.skip(f"cannot give a directory to another user here: {error}")
    try:
        with pytest.raises(ValueError, match=f"{directory} is owned by uid {uid}, not by the current uid"):
            DiskTier(str(directory), MiB)
    finally:
        os.chown(directory, os.geteuid(), -1)  # pytest must be able to remove it later


def test_a_file_in_place_of_the_directory_is_refused(tmp_path):
    path = tmp_path / "cache"
    path.write_text("")
    with pytest.raises((ValueError, FileExistsError), match=str(path)):
        DiskTier(str(path), MiB)


def test_a_symbolic_link_as_the_directory_is_refused(tmp_path):
    """Whoever can re-point the link would choose, later, where entries are read and written."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    os.symlink(target, tmp_path / "cache")
    with pytest.raises(ValueError, match="is a symbolic link"):
        DiskTier(str(tmp_path / "cache"), MiB)


def test_junk_under_entry_names_and_a_removed_directory_are_survived(tmp_path):
    directory = tmp_path / "cache"
    tier = DiskTier(str(directory), MiB)
    key = make_key(1)
    os.mkdir(tier.path(key))  # a directory under an entry's name
    DiskTier(str(directory), 1)  # eviction at start passes it by
    assert tier.get(key) is None and tier.stats().entries == 0
    tier.flush()
    shutil.rmtree(directory)
    assert tier.stats().entries == 0  # /metrics keeps working
    tier.flush()
    assert tier.put(make_key(2), entry_for(make_key(2))) is False  # a logged failed write


# Two servers on one directory.


def test_two_disk_tiers_on_one_directory_never_crash_nor_serve_a_wrong_tensor(tmp_path):
    keys = [make_key(i, i + 1) for i in range(24)]
    size = file_size_of(tmp_path / "scratch", entry_for(keys[0]))
    capacity = 6 * size
    tiers = [DiskTier(str(tmp_path / "shared"), capacity) for _ in range(2)]
    errors, hits = [], [0]

    def server(tier: DiskTier, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    tier.put(key, entry_for(key))
                else:
                    got = tier.get(key)
                    if got is not None:
                        assert_same_entry(got, entry_for(key))
                        hits[0] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=server, args=(tiers[i % 2], i)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    stats = [tier.stats() for tier in tiers]
    assert sum(s.rejected for s in stats) == 0  # no reader ever saw a half-written file
    assert hits[0] > 0 and sum(s.evicted for s in stats) > 0  # both paths were exercised
    assert stats[0].bytes <= capacity and stats[0].entries <= 6
    assert not [n for n in os.listdir(tmp_path / "shared") if n.endswith(".tmp")]


# CacheTiers: the background thread.


def test_put_then_close_persists_for_a_fresh_disk_tier(tmp_path):
    key = make_key(4, 2)
    tiers = CacheTiers(HostTier(MiB), DiskTier(str(tmp_path), 64 * MiB))
    tiers.put(key, entry_for(key))
    tiers.close()
    assert_same_entry(DiskTier(str(tmp_path), 64 * MiB).get(key), entry_for(key))


def slow_disk(monkeypatch, disk: DiskTier, calls: Optional[list] = None) -> tuple[threading.Event, threading.Event]:
    """Makes the disk's puts wait for `release`; `started` is set when one begins; each
    put's key is appended to `calls`."""
    started, release = threading.Event(), threading.Event()
    put = disk.put

    def slow_put(key, tensors):
        if calls is not None:
            calls.append(key)
        started.set()
        assert release.wait(30)
        return put(key, tensors)

    monkeypatch.setattr(disk, "put", slow_put)
    return started, release


def test_a_full_queue_drops_disk_writes_without_blocking(tmp_path, monkeypatch):
    disk = DiskTier(str(tmp_path), 64 * MiB)
    started, release = slow_disk(monkeypatch, disk)
    keys = [make_key(i) for i in range(5)]
    tiers = CacheTiers(HostTier(MiB), disk, queue_jobs=1)
    tiers.put(keys[0], entry_for(keys[0]))
    assert started.wait(30)  # the writer holds keys[0]; the queue has room for one more
    begin = time.monotonic()
    for key in keys[1:]:
        tiers.put(key, entry_for(key))
    assert time.monotonic() - begin < 1.0
    assert tiers.stats()["dropped_writes"] == 3
    assert all(tiers.host.contains(key) for key in keys)  # the host tier took every entry
    release.set()
    tiers.close()
    assert [disk.contains(key) for key in keys] == [True, True, False, False, False]


def test_prefetch_makes_the_next_get_a_host_hit(tmp_path):
    a, b, absent = make_key(1, 1), make_key(2, 2), make_key(3, 3)
    writer = DiskTier(str(tmp_path), 64 * MiB)
    writer.put(a, entry_for(a))
    writer.put(b, entry_for(b))
    with CacheTiers(HostTier(MiB), DiskTier(str(tmp_path), 64 * MiB)) as tiers:
        tiers.prefetch([a, b, absent])
        tiers.drain()
        assert tiers.stats()["host"]["entries"] == 2
        disk_before = tiers.stats()["disk"]
        assert (disk_before["hits"], disk_before["misses"]) == (2, 1)
        assert_same_entry(tiers.get(a), entry_for(a))
        stats = tiers.stats()
        assert stats["host"]["hits"] == 1 and stats["host"]["misses"] == 0
        assert stats["disk"]["hits"] == 2 and stats["disk"]["load_seconds"] > 0


def test_flush_removes_every_entry_and_nothing_else(tmp_path):
    keys = [make_key(i) for i in range(3)]
    with CacheTiers(HostTier(MiB), DiskTier(str(tmp_path), 64 * MiB)) as tiers:
        for key in keys:
            tiers.put(key, entry_for(key))
        tiers.drain()
        (tmp_path / "notes.txt").write_text("not an entry")
        assert len(entry_files(tmp_path)) == 3
        tiers.flush()
        assert entry_files(tmp_path) == [] and (tmp_path / "notes.txt").exists()
        assert all(tiers.get(key) is None for key in keys)
        stats = tiers.stats()
        assert stats["host"]["entries"] == stats["disk"]["entries"] == 0


def test_flush_drops_the_writes_still_queued(tmp_path, monkeypatch):
    disk = DiskTier(str(tmp_path), 64 * MiB)
    calls = []
    started, release = slow_disk(monkeypatch, disk, calls)
    running, queued = make_key(1), make_key(2)
    with CacheTiers(HostTier(MiB), disk) as tiers:
        tiers.put(running, entry_for(running))
        assert started.wait(30)
        tiers.put(queued, entry_for(queued))
        flusher = threading.Thread(target=tiers.flush)
        flusher.start()
        time.sleep(0.05)
        assert flusher.is_alive()  # waits for the write in progress rather than racing it
        release.set()
        flusher.join()
        tiers.drain()
        assert entry_files(tmp_path) == [] and calls == [running]


def test_engine_and_server_threads_together(tmp_path):
    keys = [make_key(i, 7) for i in range(16)]
    entry_bytes = 256 * 4 + 128 * 2
    errors = []
    stop = threading.Event()
    with CacheTiers(HostTier(4 * entry_bytes), DiskTier(str(tmp_path), 64 * MiB), queue_jobs=4) as tiers:

        def engine() -> None:
            rng = random.Random(0)
            try:
                for _ in range(300):
                    key = rng.choice(keys)
                    got = tiers.get(key)
                    if got is None:
                        tiers.put(key, entry_for(key))
                    else:
                        assert_same_entry(got, entry_for(key))
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)
            finally:
                stop.set()

        def server() -> None:
            rng = random.Random(1)
            try:
                while not stop.is_set():
                    tiers.stats()
                    tiers.prefetch(rng.sample(keys, 3))
                    if rng.random() < 0.05:
                        tiers.flush()
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=engine), threading.Thread(target=server)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert tiers.stats()["disk"]["rejected"] == 0


def test_puts_after_close_stay_in_host_and_count_as_dropped(tmp_path):
    tiers = CacheTiers(HostTier(MiB), DiskTier(str(tmp_path), 64 * MiB))
    tiers.close()
    key = make_key(1)
    tiers.put(key, entry_for(key))
    assert tiers.host.contains(key) and not tiers.disk.contains(key)
    assert tiers.stats()["dropped_writes"] == 1


def test_disk_only_and_host_only_tiers(tmp_path):
    key = make_key(8)
    with CacheTiers(None, DiskTier(str(tmp_path), 64 * MiB)) as disk_only:
        disk_only.put(key, entry_for(key))
        disk_only.drain()
        assert_same_entry(disk_only.get(key), entry_for(key))
        assert "host" not in disk_only.stats()
    host_only = CacheTiers(HostTier(MiB), None)
    host_only.put(key, entry_for(key))
    host_only.prefetch([key])
    assert_same_entry(host_only.get(key), entry_for(key))
    host_only.close()
    assert "disk" not in host_only.stats()

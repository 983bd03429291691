"""A GGUF file's structure, read with every length and offset checked against the
file before anything is allocated or looped over.

A model file is untrusted input. The `gguf` package's reader trusts the lengths
the file declares: a 128-byte file whose metadata array claims 2^62 elements
makes it loop past the end of the file without bound. This reader parses the
header itself (magic, version, metadata, tensor infos), refuses any length or
offset that reaches past the file with a message naming the key or tensor, and
maps the tensor data read-only; it needs only numpy (so a board without the
`gguf` package reads the header too).

Format: llama.cpp's `docs/gguf.md` (version 2 and 3, little-endian).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any, Optional

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4          # GGML_MAX_DIMS
_MAX_ARRAY_DEPTH = 2  # arrays of arrays exist (rarely); deeper nesting is refused

# Metadata value types: (name, numpy dtype, struct format) of the fixed-size scalars.
_SCALARS = {0: ("UINT8", "<u1", "<B"), 1: ("INT8", "<i1", "<b"), 2: ("UINT16", "<u2", "<H"),
            3: ("INT16", "<i2", "<h"), 4: ("UINT32", "<u4", "<I"), 5: ("INT32", "<i4", "<i"),
            6: ("FLOAT32", "<f4", "<f"), 7: ("BOOL", "<u1", "<B"), 10: ("UINT64", "<u8", "<Q"),
            11: ("INT64", "<i8", "<q"), 12: ("FLOAT64", "<f8", "<d")}
_STRING, _ARRAY, _BOOL = 8, 9, 7
# The string arrays the engine reads; any other key's string array longer than
# _MAX_UNREAD_STRINGS is stepped over, not kept (a Python string costs about
# 50 bytes beside its text: a file of many short strings multiplied its size
# in memory tenfold before anything checked it).
_READ_STRING_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
_MAX_UNREAD_STRINGS = 1 << 16

# ggml tensor types: id -> (name, elements per block, bytes per block).
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


class GgufFormatError(ValueError):
    """The file is not a well-formed GGUF; the message names where and why."""


@dataclasses.dataclass(frozen=True)
class Unread:
    """A metadata value this reader stepped over (a long string array no part of the
    engine reads); `what` says what it held."""
    what: str


# What a metadata value must be, for typed(): a check and its name in errors.
_KINDS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "integer array": lambda v: isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu",
    "boolean array": lambda v: isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype == np.bool_,
}


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.shape[0]} {value.dtype}"
    if isinstance(value, list):
        return f"an array of {len(value)} values"
    return f"{type(value).__name__} {value!r}"[:120]


def typed(meta: dict[str, Any], key: str, kind: str, default: Any = None, source: str = "") -> Any:
    """meta[key] (or `default` when absent) if it is a `kind` (a key of _KINDS), else a
    GgufFormatError naming the key, the kind and what the file holds. Every read of a
    model file's metadata goes through here: a file is untrusted, and an array where a
    string belongs once surfaced as a TypeError deep in the loader."""
    value = meta.get(key)
    if value is None:
        return default
    if not _KINDS[kind](value):
        raise GgufFormatError(f"{source + ': ' if source else ''}metadata {key!r} must be a {kind}, "
                              f"the file holds {_describe(value)}")
    return value


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]   # GGUF order: dims[0] is the contiguous one (ggml's ne)
    type_id: int
    offset: int             # absolute byte offset of the data in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES[self.type_id][0]

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy / torch order: rows first."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


class GgufFile:
    """The parsed header of one GGUF file, its metadata and its tensors' bytes (mapped)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = os.path.getsize(path)
        with open(path, "rb") as f:
            if self.size == 0:
                raise GgufFormatError(f"{path} is empty")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        probe = np.frombuffer(self._map, dtype=np.uint8, count=1)
        self._address = probe.ctypes.data  # where the map starts (release_bytes)
        del probe  # an exported buffer would keep close() from unmapping
        self._pos = 0
        try:
            self._parse()
        except struct.error as e:  # a read past the end that slipped a check: still a format error
            raise GgufFormatError(f"{path}: truncated header ({e})") from None

    def close(self, after_error: bool = False) -> None:
        """Unmaps the file. After an error (`after_error`), views of it may still be held
        by the error's traceback: then the map goes with them, and the error that is
        propagating is not replaced by mmap's BufferError."""
        try:
            self._map.close()
        except BufferError:
            if not after_error:
                raise

    # -- reading primitives, each bounded by the file ---------------------------------
    def _need(self, n: int, what: str) -> None:
        if n < 0 or self._pos + n > self.size:
            raise GgufFormatError(f"{self.path}: {what} needs {n} bytes at offset {self._pos}, "
                                  f"past the end of the {self.size}-byte file (truncated or corrupt)")

    def _unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self._need(n, what)
        value = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += n
        return value[0] if len(value) == 1 else value

    def _string(self, what: str) -> str:
        n = self._unpack("<Q", f"the length of {what}")
        self._need(n, what)
        raw = self._map[self._pos:self._pos + n]
        self._pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GgufFormatError(f"{self.path}: {what} is not valid UTF-8") from None

    def _value(self, type_id: int, key: str, depth: int = 0) -> Any:
        if type_id in _SCALARS:
            name, _, fmt = _SCALARS[type_id]
            value = self._unpack(fmt, f"metadata {key!r} ({name})")
            return bool(value) if type_id == _BOOL else value
        if type_id == _STRING:
            return self._string(f"metadata {key!r}")
        if type_id == _ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise GgufFormatError(f"{self.path}: metadata {key!r} nests arrays more than {_MAX_ARRAY_DEPTH} deep")
            elem = self._unpack("<I", f"the element type of metadata {key!r}")
            count = self._unpack("<Q", f"the length of metadata {key!r}")
            if elem in _SCALARS:
                dtype = np.dtype(_SCALARS[elem][1])
                # Checked before anything is allocated: the count is the file's claim.
                if count > (self.size - self._pos) // dtype.itemsize:
                    raise GgufFormatError(f"{self.path}: metadata {key!r} declares {count} elements of "
                                          f"{_SCALARS[elem][0]}, more than the {self.size - self._pos} bytes "
                                          "left in the file hold")
                # Kept as numpy (a copy: the map may be closed first), as compact as in the file.
                values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos).copy()
                self._pos += count * dtype.itemsize
                values = values.astype(bool) if elem == _BOOL else values
                values.flags.writeable = False
                return values
            if elem in (_STRING, _ARRAY):
                minimum = 8 if elem == _STRING else 12  # a length, or an element type and a length
                if count > (self.size - self._pos) // minimum:
                    raise GgufFormatError(f"{self.path}: metadata {key!r} declares {count} elements, more than "
                                          f"the {self.size - self._pos} bytes left in the file hold")
                if elem == _STRING and key not in _READ_STRING_ARRAYS and count > _MAX_UNREAD_STRINGS:
                    for _ in range(count):
                        n = self._unpack("<Q", f"the length of an element of metadata {key!r}")
                        self._need(n, f"metadata {key!r}")
                        self._pos += n
                    return Unread(f"{count} strings")
                return [self._value(elem, key, depth + 1) for _ in range(count)]
            raise GgufFormatError(f"{self.path}: metadata {key!r} is an array of unknown type {elem}")
        raise GgufFormatError(f"{self.path}: metadata {key!r} has unknown value type {type_id}")

    # -- the header --------------------------------------------------------------
    def _parse(self) -> None:
        self._need(4, "the magic")
        if self._map[:4] != MAGIC:
            raise GgufFormatError(f"{self.path} is not a GGUF file (no 'GGUF' magic at its start)")
        self._pos = 4
        self.version = self._unpack("<I", "the version")
        if self.version not in (2, 3):
            raise GgufFormatError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors = self._unpack("<Q", "the tensor count")
        n_kv = self._unpack("<Q", "the metadata count")
        # A metadata entry takes at least 12 bytes, a tensor info at least 32.
        if n_kv > (self.size - self._pos) // 12 or n_tensors > (self.size - self._pos) // 32:
            raise GgufFormatError(f"{self.path}: the header declares {n_kv} metadata entries and {n_tensors} "
                                  f"tensors, more than the {self.size}-byte file holds")
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for i in range(n_kv):
            key = self._string(f"the key of metadata entry {i}")
            if key in self.metadata:
                raise GgufFormatError(f"{self.path}: metadata {key!r} appears twice")
            type_id = self._unpack("<I", f"the value type of metadata {key!r}")
            self.metadata_types[key] = type_id
            self.metadata[key] = self._value(type_id, key)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not _KINDS["integer"](alignment) or alignment <= 0 or \
                alignment & (alignment - 1) or alignment > 1 << 16:
            raise GgufFormatError(f"{self.path}: general.alignment = {alignment!r} is not a power of two "
                                  "up to 65536")
        infos = []
        for i in range(n_tensors):
            name = self._string(f"the name of tensor {i}")
            n_dims = self._unpack("<I", f"the rank of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GgufFormatError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
            dims = tuple(self._unpack("<Q", f"the dimensions of tensor {name!r}") for _ in range(n_dims))
            type_id = self._unpack("<I", f"the type of tensor {name!r}")
            offset = self._unpack("<Q", f"the data offset of tensor {name!r}")
            infos.append((name, dims, type_id, offset))
        data_start = -(-self._pos // alignment) * alignment
        self.data_offset = data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in infos:
            if name in self.tensors:
                raise GgufFormatError(f"{self.path}: tensor {name!r} appears twice")
            if type_id not in TENSOR_TYPES:
                raise GgufFormatError(f"{self.path}: tensor {name!r} has unknown ggml type {type_id}")
            type_name, block, type_size = TENSOR_TYPES[type_id]
            if any(d == 0 or d > self.size * 64 for d in dims):
                raise GgufFormatError(f"{self.path}: tensor {name!r} has dimensions {list(dims)}")
            if dims[0] % block:
                raise GgufFormatError(f"{self.path}: tensor {name!r} of type {type_name} has rows of {dims[0]} "
                                      f"elements, not a multiple of its block of {block}")
            n = 1
            for d in dims:
                n *= d
            n_bytes = n // block * type_size
            start = data_start + offset
            if offset % alignment:
                raise GgufFormatError(f"{self.path}: tensor {name!r} starts at data offset {offset}, not "
                                      f"aligned to {alignment}")
            if start + n_bytes > self.size:
                raise GgufFormatError(f"{self.path} is truncated: tensor {name!r} ends at byte {start + n_bytes}, "
                                      f"the file has {self.size}")
            self.tensors[name] = TensorInfo(name, dims, type_id, start, n_bytes)

    # -- tensor data ---------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as a read-only uint8 view of the file, shaped
        [..., bytes per row] (rows as numpy orders them)."""
        t = self.tensors[name]
        _, block, type_size = TENSOR_TYPES[t.type_id]
        data = np.frombuffer(self._map, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        return data.reshape(*t.shape[:-1], t.dims[0] // block * type_size)

    def release(self, name: str) -> None:
        """Drops a tensor's pages from this process's memory (they stay in the file and
        come back if read again): a loader that has copied a tensor calls it, so the
        file is never resident beside what was made of it."""
        t = self.tensors[name]
        self.release_bytes(self._address + t.offset, t.n_bytes)

    def release_bytes(self, address: int, n_bytes: int) -> None:
        """release() for the pages under [address, address + n_bytes), when they are this
        file's (a view of it, copied): a loader copying a tensor a slab of rows at a time
        releases each slab, so the file's pages of it are never all resident."""
        start, end = address - self._address, address - self._address + n_bytes
        if start < 0 or end > self.size or n_bytes <= 0:
            return
        page = mmap.PAGESIZE
        start = start // page * page
        self._map.madvise(mmap.MADV_DONTNEED, start, min(-(-end // page) * page, self.size) - start)

    def array(self, name: str) -> Optional[np.ndarray]:
        """A tensor of a plain numeric type (F32, F16, F64, I8..I64) as a read-only view, else None."""
        dtypes = {0: "<f4", 1: "<f2", 28: "<f8", 24: "<i1", 25: "<i2", 26: "<i4", 27: "<i8"}
        t = self.tensors[name]
        if t.type_id not in dtypes:
            return None
        return np.frombuffer(self._map, dtype=dtypes[t.type_id], count=t.n_elements, offset=t.offset).reshape(t.shape)

"""Hostile GGUF files: every malformed file is refused with an error that names the
problem (a ValueError the server reports), in bounded time and memory. Never a hang,
a traceback of some other type, or an allocation the file's lengths dictate.

The files are written byte by byte here (a small GGUF writer that can also write
what no honest writer would), starting from a valid tiny Llama checkpoint."""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import time
import tracemalloc

import numpy as np
import pytest
import torch
import transformers

from rvascend.models.random_model import ensure_random_model
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models import gguf_export, gguf_file
from rvascend.models.loader import load_model

_U8, _I32, _U32, _F32, _BOOL, _STR, _ARR, _U64 = 0, 5, 4, 6, 7, 8, 9, 10
_TIME_LIMIT_S = 10
_MEMORY_LIMIT = 256 << 20


def _value(type_id: int, value) -> bytes:
    if type_id == _STR:
        raw = value.encode()
        return struct.pack("<Q", len(raw)) + raw
    if type_id == _ARR:
        elem, items = value
        return struct.pack("<IQ", elem, len(items)) + b"".join(_value(elem, v) for v in items)
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    return struct.pack(fmt[type_id], value)


def write(path: str, metadata: list[tuple[str, int, object]], tensors: list[tuple[str, tuple, int, bytes]],
          version: int = 3, alignment: int = 32) -> None:
    """A GGUF file: metadata (key, type, value) and tensors (name, GGUF dims, ggml type, bytes)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, type_id, value in metadata:
        out += _value(_STR, key) + struct.pack("<I", type_id) + _value(type_id, value)
    offset = 0
    for name, dims, type_id, data in tensors:
        out += _value(_STR, name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", type_id, offset)
        offset += -(-len(data) // alignment) * alignment
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % alignment)
    with open(path, "wb") as f:
        f.write(out)


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[list, list]:
    """(metadata, tensors) of a valid tiny Llama GGUF, as the writer above takes them."""
    tmp = tmp_path_factory.mktemp("valid")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                                      max_position_embeddings=256, tie_word_embeddings=True)
    hf_dir = str(tmp / "hf")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ensure_random_model(), name), os.path.join(hf_dir, name))
    path = str(tmp / "valid.gguf")
    gguf_export.export(hf_dir, path, {})
    f = gguf_file.GgufFile(path)
    metadata = [(k, f.metadata_types[k], _typed(f.metadata_types[k], v)) for k, v in f.metadata.items()]
    tensors = [(t.name, t.dims, t.type_id, f.raw(t.name).tobytes()) for t in f.tensors.values()]
    return metadata, tensors


def _typed(type_id: int, value):
    if type_id != _ARR:
        return value
    if isinstance(value, np.ndarray):
        return ({"b": _BOOL, "f": _F32}.get(value.dtype.kind, _I32), value.tolist())
    if not value:
        return (_U8, [])
    first = value[0]
    elem = _STR if isinstance(first, str) else _F32 if isinstance(first, float) else _I32
    return (elem, value)


def _load(path: str):
    """What the server does with a model path: the weights and the tokenizer."""
    load_model(path)
    Tokenizer(path)


def _refused(path: str, match: str = "") -> str:
    """The error `_load` gives, checked to be a clear one, fast and small."""
    def alarm(*_):
        raise TimeoutError(f"loading {path} took over {_TIME_LIMIT_S} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(_TIME_LIMIT_S)
    tracemalloc.start()
    try:
        with pytest.raises((ValueError, FileNotFoundError)) as info:
            _load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert peak < _MEMORY_LIMIT, f"{path}: {peak / 2**20:.0f} MiB allocated before refusing"
    assert match in str(info.value), str(info.value)
    return str(info.value)


def _edit(valid, **changes) -> tuple[list, list]:
    metadata, tensors = valid
    out = []
    for key, type_id, value in metadata:
        if key in changes:
            if changes[key] is not None:
                out.append((key, *changes[key]))
            continue
        out.append((key, type_id, value))
    present = {k for k, _, _ in metadata}
    out += [(k, *v) for k, v in changes.items() if k not in present and v is not None]
    return out, list(tensors)


def test_the_valid_file_loads(valid, tmp_path):
    path = str(tmp_path / "m.gguf")
    write(path, *valid)
    _load(path)


@pytest.mark.parametrize("elem", [_U8, _I32])
def test_an_array_longer_than_the_file_is_refused_at_once(tmp_path, elem):
    """The 128-byte file that hung the gguf package's reader with memory growing without bound."""
    path = str(tmp_path / "hang.gguf")
    write(path, [("general.architecture", _STR, "llama")], [])
    data = bytearray(open(path, "rb").read())
    data += b"\0" * (128 - len(data))
    # One more metadata entry whose array declares 2^62 elements.
    data[16:24] = struct.pack("<Q", 2)
    entry = _value(_STR, "evil") + struct.pack("<IIQ", _ARR, elem, 1 << 62)
    data = data[:24 + len(_value(_STR, "general.architecture")) + 4 + len(_value(_STR, "llama"))] + entry
    data += b"\0" * (128 - len(data))
    open(path, "wb").write(bytes(data))
    start = time.monotonic()
    _refused(path, "metadata 'evil' declares 4611686018427387904 elements")
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("key,value,message", [
    ("llama.attention.head_count", (_U32, 0), "llama.attention.head_count = 0"),
    ("llama.block_count", (_U32, 1), "block_count = 1 but the file has tensors of layer 1"),
    ("llama.block_count", (_U32, 4000), "block_count = 4000 but the file has no tensors of layer 2"),
    ("llama.embedding_length", (_U32, 96), "embedding_length = 96 but token_embd.weight has rows of 64"),
    ("llama.attention.head_count_kv", (_U32, 3), "do not split into 3 KV head groups"),
    ("llama.feed_forward_length", (_U32, 100), "ffn 100) implies"),
    ("llama.context_length", (_I32, -5), "context_length = -5"),
    ("llama.attention.layer_norm_rms_epsilon", (_F32, float("nan")), "layer_norm_rms_epsilon = nan"),
    ("llama.rope.freq_base", (_STR, "ten thousand"), "rope.freq_base = 'ten thousand'"),
    ("tokenizer.ggml.tokens", None, "tokenizer.ggml.tokens is missing"),
    ("tokenizer.ggml.merges", (_ARR, (_STR, ["nospace"])), "tokenizer.ggml.merges"),
    ("tokenizer.ggml.bos_token_id", (_U32, 99999), "tokenizer.ggml.bos_token_id = 99999"),
    ("general.alignment", (_U32, 3), "general.alignment = 3"),
])
def test_each_malformed_config_is_named(valid, tmp_path, key, value, message):
    path = str(tmp_path / "m.gguf")
    write(path, *_edit(valid, **{key: value}))
    _refused(path, message)


def test_wrong_attention_rows_name_the_tensor(valid, tmp_path):
    metadata, tensors = valid
    tensors = [(n, (64, 60) if n == "blk.0.attn_q.weight" else d, t,
                b[:64 * 60 * 4] if n == "blk.0.attn_q.weight" else b) for n, d, t, b in tensors]
    path = str(tmp_path / "m.gguf")
    write(path, metadata, tensors)
    _refused(path, "tensor blk.0.attn_q.weight has shape [60, 64], the config")


@pytest.mark.parametrize("key,value", [
    ("general.architecture", (_ARR, (_STR, ["llama", "qwen3"]))),
    ("tokenizer.ggml.eos_token_id", (_ARR, (_I32, [1, 2]))),
    ("tokenizer.ggml.pre", (_ARR, (_STR, ["gpt2"]))),
    ("tokenizer.ggml.model", (_U32, 2)),
    ("tokenizer.ggml.token_type", (_STR, "normal")),
    ("tokenizer.ggml.add_bos_token", (_STR, "yes")),
    ("llama.rope.scaling.type", (_ARR, (_STR, ["linear"]))),
])
def test_type_confused_metadata_is_named(valid, tmp_path, key, value):
    """A key of the wrong type (an array where a string or an id belongs) once gave a
    TypeError traceback; each read is typed and names the key."""
    path = str(tmp_path / "m.gguf")
    write(path, *_edit(valid, **{key: value}))
    _refused(path, f"metadata {key!r} must be a")


def test_a_missing_layer_tensor_is_named_not_hidden(valid, tmp_path, monkeypatch):
    """The loader closes the file's map on its way out of an error; a view of the map
    that the error's traceback still holds once made that close raise BufferError in
    place of the error."""
    from rvascend.models import loader
    metadata, tensors = valid
    path = str(tmp_path / "m.gguf")
    write(path, metadata, [t for t in tensors if t[0] != "blk.1.ffn_down.weight"])
    for keep in (False, True):
        with pytest.raises(ValueError, match="lacks tensors: model.layers.1.mlp.down_proj"):
            load_model(path, keep_quantized=keep)
    write(path, *valid)
    original = loader._load

    def fails_holding_a_view(model_path, ckpt, *args):
        view = ckpt._file.raw("blk.0.ffn_down.weight")  # alive in this frame of the traceback
        original(model_path, ckpt, *args)
        raise ValueError(f"tensor blk.0.ffn_down.weight of {view.shape} is wrong")
    monkeypatch.setattr(loader, "_load", fails_holding_a_view)
    with pytest.raises(ValueError, match="blk.0.ffn_down.weight of"):
        load_model(path)
    f = gguf_file.GgufFile(path)
    view = f.raw("blk.0.ffn_down.weight")
    with pytest.raises(BufferError):
        f.close()  # outside an error, a live view is still the caller's bug, and said so
    f.close(after_error=True)
    del view


def test_metadata_arrays_stay_as_compact_as_the_file(valid, tmp_path):
    """Numeric arrays stay numpy and long string arrays of keys the engine never reads
    are stepped over: a 38 MiB file of such arrays once grew RSS by 383 MiB."""
    big = [("x.numbers", _ARR, (_I32, list(range(2_000_000)))),
           ("x.words", _ARR, (_STR, ["w"] * 600_000))]
    metadata, tensors = valid
    path = str(tmp_path / "m.gguf")
    write(path, metadata + big, tensors)
    size = os.path.getsize(path)
    tracemalloc.start()
    try:
        f = gguf_file.GgufFile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(f.metadata["x.numbers"], np.ndarray) and f.metadata["x.numbers"][-1] == 1_999_999
    assert f.metadata["x.words"] == gguf_file.Unread("600000 strings")
    assert peak < 2 * size, f"{peak / 2**20:.0f} MiB allocated reading a {size / 2**20:.0f} MiB file"
    f.close()
    _load(path)  # the model itself is unaffected


def test_misleading_messages_are_gone(tmp_path):
    _refused(str(tmp_path / "no-such-model"), "does not exist")


def test_fuzzed_files_are_refused_cleanly(valid, tmp_path):
    """Truncations, byte flips in the header and tensor infos, and out-of-range
    values of every numeric config key: a clear error each time (or a file that
    still loads), within the time and memory limits."""
    base = str(tmp_path / "base.gguf")
    write(base, *valid)
    data = open(base, "rb").read()
    header_end = gguf_file.GgufFile(base).data_offset
    rng = random.Random(0)
    path = str(tmp_path / "fuzz.gguf")
    cases = [data[:n] for n in sorted({rng.randrange(1, len(data)) for _ in range(40)} | {4, 8, 23, header_end})]
    for _ in range(150):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(header_end)] ^= 1 << rng.randrange(8)
        cases.append(bytes(flipped))
    for i, case in enumerate(cases):
        with open(path, "wb") as f:
            f.write(case)
        try:
            _refused(path)
        except pytest.fail.Exception:
            pass  # the flip left a loadable file (a weight or an unused string changed): fine
    metadata, _ = valid
    numeric = [(k, t) for k, t, _ in metadata if k.startswith("llama.") and t in (_U32, _I32, _F32, _U64)]
    assert len(numeric) >= 6
    for key, type_id in numeric:
        bads = [(_I32, 0), (_I32, -1), (_U64, 1 << 40)] if type_id != _F32 else \
            [(_F32, 0.0), (_F32, -1.0), (_F32, float("inf"))]
        for bad in bads:
            write(path, *_edit(valid, **{key: bad}))
            try:
                _refused(path, key)
            except pytest.fail.Exception:
                # Some values are legal for some keys (e.g. a large context length).
                _load(path)


def test_every_metadata_type_reads_as_the_gguf_package_reads_it(tmp_path):
    import gguf

    values = [("u8", 0, 200), ("i8", 1, -100), ("u16", 2, 60000), ("i16", 3, -30000), ("u32", 4, 4000000000),
              ("i32", 5, -2000000000), ("f32", 6, 1.5), ("bool", 7, True), ("str", 8, "héllo"),
              ("u64", 10, 1 << 60), ("i64", 11, -(1 << 60)), ("f64", 12, 2.25),
              ("arr_i64", 9, (11, [1 << 40, -3])), ("arr_str", 9, (8, ["a", "bc"])),
              ("arr_arr", 9, (9, [(5, [1, 2]), (5, [3])]))]
    path = str(tmp_path / "types.gguf")
    write(path, values, [])
    ours = gguf_file.GgufFile(path).metadata
    theirs = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if not k.startswith("GGUF.")}
    # The package flattens nested arrays; the nesting is the file's.
    assert [a.tolist() for a in ours.pop("arr_arr")] == [[1, 2], [3]] and theirs.pop("arr_arr") == [1, 2, 3]
    assert isinstance(ours["arr_i64"], np.ndarray)
    assert {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in ours.items()} == theirs

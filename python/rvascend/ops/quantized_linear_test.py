"""The quantized-linear torch op against the gguf package (llama.cpp's Python library):
the same dequantized values, products within the activation-quantization bound of
F.linear on them, clear errors for every bad input, and tracing under torch.compile."""

from __future__ import annotations

import ctypes
import mmap
import sys

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rvascend.ops import quantized_linear as q

Q = gguf.GGMLQuantizationType
# The formats the gguf package can quantize; the others are random blocks with finite scales
# (files from llama.cpp's quantizer: engine/quantized_model_test.py).
WRITABLE = {"Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q4_1": Q.Q4_1, "Q5_0": Q.Q5_0, "Q5_1": Q.Q5_1}
# Byte offsets of each format's f16 scales in a GGML block (GGML's block structs).
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2),
                 "IQ4_NL": (0,), "IQ4_XS": (0,)}


def _weight(fmt: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    rng = np.random.default_rng(seed)
    kind = Q[fmt]
    if fmt in WRITABLE:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), kind)
    else:
        block_k, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        blocks = rng.integers(0, 256, size=(n * (k // block_k), block_bytes), dtype=np.uint8)
        for off in SCALE_OFFSETS[fmt]:  # finite scales of both signs, 1/64 .. 1/8 in magnitude
            scale = (rng.choice([-1, 1], blocks.shape[0]) * rng.uniform(1 / 64, 1 / 8, blocks.shape[0]))
            blocks[:, off:off + 2] = scale.astype("<f2").view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(n, -1)
    return raw, torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float32).reshape(n, k))


def test_every_kept_format_has_a_weight_maker():
    assert set(WRITABLE) | set(SCALE_OFFSETS) == set(q.FORMATS)


@pytest.mark.parametrize("fmt", q.FORMATS)
@pytest.mark.parametrize("n,k", [(1, 256), (70, 768), (300, 512)])
def test_dequantization_is_the_gguf_packages(fmt, n, k):
    raw, want = _weight(fmt, n, k)
    assert torch.equal(q.dequantize_ggml(raw, fmt, n, k), want)
    packed = q.repack_ggml(raw, fmt, n, k)
    ids = torch.tensor([[0, n - 1], [n // 2, 0]])
    assert torch.equal(q.dequantize_rows(packed, fmt, n, k, q.quant_tile(), ids), want[ids])


@pytest.mark.parametrize("fmt", q.FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_product_matches_f_linear_on_the_dequantized_weight(fmt, dtype, m):
    n, k = 200, 512
    raw, w = _weight(fmt, n, k, seed=m)
    packed = q.repack_ggml(raw, fmt, n, k)
    x = torch.randn(m, k).to(dtype)
    got = q.quantized_linear(x, packed, fmt, n, q.quant_tile())
    assert got.dtype == dtype and got.shape == (m, n)
    want = F.linear(x.double(), w.double())
    # Activations are quantized per 32 to int8 (half a step: amax / 254 per value); summed
    # over K with random signs that is a few tenths of a percent of sum |w x|.
    scale = F.linear(x.double().abs(), w.double().abs())
    assert ((got.double() - want).abs() <= 0.01 * scale + 1e-6).all()


def test_bad_inputs_are_named():
    raw, _ = _weight("Q4_0", 64, 64)
    packed = q.repack_ggml(raw, "Q4_0", 64, 64)
    x = torch.randn(2, 64).bfloat16()
    t = q.quant_tile()
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        q.quantized_linear(x.half(), packed, "Q4_0", 64, t)
    with pytest.raises(ValueError, match="not kept quantized"):
        q.quantized_linear(x, packed, "IQ2_XS", 64, t)
    with pytest.raises(ValueError, match="layout version 7"):
        q.quantized_linear(x, packed, "Q4_0", 64, t, layout_version=7)
    with pytest.raises(ValueError, match="repacked for another shape"):
        q.quantized_linear(x, packed, "Q4_0", 96, t)
    with pytest.raises(ValueError, match="whole number of Q4_0's 32-value blocks"):
        q.quantized_linear(torch.randn(2, 48).bfloat16(), packed, "Q4_0", 64, t)
    with pytest.raises(ValueError, match="whole number of 32-value blocks"):
        q.repack_ggml(raw, "Q4_0", 64, 48)
    bad = raw.copy().reshape(-1)
    bad[18 * 5:18 * 5 + 2] = np.frombuffer(np.float16(np.inf).tobytes(), dtype=np.uint8)
    with pytest.raises(ValueError, match="row 2, block 1 has a NaN or infinite scale"):
        q.repack_ggml(bad, "Q4_0", 64, 64)
    with pytest.raises(ValueError, match="outside the 64 rows"):
        q.dequantize_rows(packed, "Q4_0", 64, 64, t, torch.tensor([64]))


def test_traces_under_torch_compile():
    raw, _ = _weight("Q8_0", 64, 64)
    packed = q.repack_ggml(raw, "Q8_0", 64, 64)
    t = q.quant_tile()

    def f(x):
        return q.quantized_linear(x, packed, "Q8_0", 64, t) * 2

    x = torch.randn(3, 64).bfloat16()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), f(x))


@pytest.mark.parametrize("fmt", q.FORMATS)
def test_every_kernel_set_gives_the_same_bits(fmt):
    raw, _ = _weight(fmt, 130, 512)
    packed = q.repack_ggml(raw, fmt, 130, 512)
    x = torch.randn(5, 512).bfloat16()
    results = []
    for name in q.available_quant_kernel_sets():
        if name != "portable" and q.quant_tile(name) != q.quant_tile():
            continue
        with q.use_quant_kernel_set(name):
            results.append(q.quantized_linear(x, packed, fmt, 130, q.quant_tile()))
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("tile", [16, 128])
def test_a_set_refuses_a_tile_it_cannot_read(tile):
    """Every set but the portable one reads one tile width. The x86 sets once took any
    width: 16 or 128 columns gave NaN or 135 % error, then a double free (abort)."""
    raw, want = _weight("Q8_0", 256, 64)
    packed = q.repack_ggml(raw, "Q8_0", 256, 64, tile)
    x = torch.randn(3, 64).bfloat16()
    for name in q.available_quant_kernel_sets():
        with q.use_quant_kernel_set(name):
            if name == "portable" or q.quant_tile(name) == tile:
                got = q.quantized_linear(x, packed, "Q8_0", 256, tile)
                assert torch.isfinite(got).all()
                continue
            with pytest.raises(ValueError, match=f"reads tiles of {q.quant_tile(name)} columns.*tiles of {tile}"):
                q.quantized_linear(x, packed, "Q8_0", 256, tile)


def test_the_format_registry_agrees_with_the_gguf_package():
    """One registry (rvv_kernels/quantized/quant_formats.inc) gives the native enum and these
    tables; each entry's GGML type id and block geometry must be the gguf package's."""
    assert q.FORMATS == tuple(f[0] for f in q._native.quant_formats()) and len(q.FORMATS) >= 5
    for name, type_id, block_k, ggml_bytes, tile_bytes, act_block in q._native.quant_formats():
        kind = gguf.GGMLQuantizationType[name]
        assert kind.value == type_id and q.GGML_TYPES[type_id] == name
        assert gguf.GGML_QUANT_SIZES[kind] == (block_k, ggml_bytes) and q.BLOCK_K[name] == block_k
        assert tile_bytes >= ggml_bytes and act_block in (32, 256)
        assert q.layout_bytes(name, 1, block_k, 16) == 16 * tile_bytes


def _guarded(data: bytes):
    """`data` placed right before a page the process may not touch: a read past its end
    faults instead of reading a neighbour. (address, keep-alive handle)"""
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + page), page, 0) == 0
    region[page - len(data):page] = data
    return base + page - len(data), region


def test_ggml_bytes_are_checked_before_any_is_read():
    """dequantize_ggml once checked every block's scale before the byte count: 2 KB
    read past a 34-byte buffer (a fault beside a guard page)."""
    raw, _ = _weight("Q8_0", 1, 32)
    address, _keep = _guarded(raw.tobytes())
    out = torch.empty(64 * 64)
    for call in (lambda: q._native.quant_dequantize_ggml("Q8_0", address, 34, 64, 64, out.data_ptr(), out.numel(), 1),
                 lambda: q._native.quant_repack("Q8_0", address, 34, 64, 64, 64, out.data_ptr(), 4 * out.numel(), 1)):
        with pytest.raises(ValueError, match=r"\[64, 64\] takes 4352 bytes, got 34"):
            call()
    with pytest.raises(ValueError, match="takes 4352 bytes, got 34"):
        q.dequantize_ggml(raw, "Q8_0", 64, 64)


@pytest.mark.parametrize("n,k", [(2**63 + 1, 32), (2**60, 2**10), (2**40, 2**40)])
def test_size_products_that_overflow_are_refused(n, k):
    """layout_bytes("Q8_0", 2**63 + 1, 32, 64) once wrapped to 2176, and a kernel then
    read row 190 of a 34-byte buffer."""
    with pytest.raises(ValueError, match="overflows a 64-bit size"):
        q.layout_bytes("Q8_0", n, k, 64)
    with pytest.raises(ValueError, match="overflows a 64-bit size"):
        q._native.quant_ggml_bytes("Q8_0", n, k)
    raw, _ = _weight("Q8_0", 1, 32)
    packed = q.repack_ggml(raw, "Q8_0", 1, 32)
    out = torch.empty(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        q._native.quant_linear("", "Q8_0", 1, n, k, out.data_ptr(), k, out.numel(), packed.data_ptr(),
                               packed.numel(), q.quant_tile(), out.data_ptr(), n, out.numel(), 1, False)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

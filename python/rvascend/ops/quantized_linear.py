"""Quantized weights kept quantized: GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, the K-quants
Q2_K .. Q6_K and IQ4_XS (FORMATS, read from the native registry).

A weight is repacked once, at load, from its GGML blocks into the runtime layout
of rvv_kernels/quantized/quant_format.h (tiles of T columns, T chosen for this
machine: VLEN/4 on RVV); `quantized_linear` multiplies BF16 activations by it
(activations quantized per block to int8 as llama.cpp does, integer
products, FP32 scales, one rounding to BF16). The layout is a runtime layout:
its version and tile travel with every call and a mismatch is an error.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import numpy as np
import torch

from rvascend.ops.packed_linear import _native, eager_call, readable_elements, register_fake, row_major

QUANT_LAYOUT_VERSION: int = int(_native.QUANT_LAYOUT_VERSION)
# The kept formats, read from the native registry (rvv_kernels/quantized/quant_formats.inc):
# their names (what every native call takes), GGML type id -> name, and each format's
# weights per block along K.
_REGISTRY = _native.quant_formats()
FORMATS: tuple[str, ...] = tuple(f[0] for f in _REGISTRY)
GGML_TYPES: dict[int, str] = {int(f[1]): f[0] for f in _REGISTRY}
BLOCK_K: dict[str, int] = {f[0]: int(f[2]) for f in _REGISTRY}


# The quantized kernel set in use: "" = the best available; RVASCEND_QUANT_KERNELS pins one.
_kernel_set: str = os.environ.get("RVASCEND_QUANT_KERNELS", "")


def available_quant_kernel_sets() -> list[str]:
    return list(_native.available_quant_kernel_sets())


@contextlib.contextmanager
def use_quant_kernel_set(name: str) -> Iterator[None]:
    """Runs quantized_linear with the kernel set `name` inside the block."""
    global _kernel_set
    if name not in available_quant_kernel_sets():
        raise ValueError(f"quantized kernel set {name!r} is not available here; "
                         f"available: {available_quant_kernel_sets()}")
    previous, _kernel_set = _kernel_set, name
    try:
        yield
    finally:
        _kernel_set = previous


def quant_tile(kernel_set: str = "") -> int:
    """The tile width this machine repacks for (the best set's, or `kernel_set`'s)."""
    return int(_native.quant_kernel_set_tile(kernel_set))


def _check_format(fmt: str) -> None:
    if fmt not in BLOCK_K:
        raise ValueError(f"quantized format {fmt!r} is not kept quantized (kept: {', '.join(FORMATS)})")


def layout_bytes(fmt: str, n: int, k: int, tile: int) -> int:
    _check_format(fmt)
    return int(_native.quant_layout_bytes(fmt, n, k, tile))


def repack_ggml(raw: np.ndarray, fmt: str, n: int, k: int, tile: int | None = None) -> torch.Tensor:
    """The runtime layout (uint8 [bytes]) of a GGML weight [n, k] given as its raw bytes
    (any uint8 array of n * k / block * block_bytes); NaN or infinite scales are refused."""
    _check_format(fmt)
    if k % BLOCK_K[fmt]:
        raise ValueError(f"{fmt} weight rows of {k} values are not a whole number of {BLOCK_K[fmt]}-value blocks")
    tile = tile or quant_tile()
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = torch.empty(layout_bytes(fmt, n, k, tile), dtype=torch.uint8)
    _native.quant_repack(fmt, raw.ctypes.data, raw.nbytes, n, k, tile, out.data_ptr(), out.numel(),
                         torch.get_num_threads())
    return out


def dequantize_ggml(raw: np.ndarray, fmt: str, n: int, k: int) -> torch.Tensor:
    """FP32 [n, k] values of a GGML weight of a kept format (no `gguf` package needed)."""
    _check_format(fmt)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    want = int(_native.quant_ggml_bytes(fmt, n, k))  # checked before the output is allocated
    if raw.nbytes != want:
        raise ValueError(f"dequantize_ggml: a {fmt} weight [{n}, {k}] takes {want} bytes, got {raw.nbytes}")
    out = torch.empty((n, k), dtype=torch.float32)
    _native.quant_dequantize_ggml(fmt, raw.ctypes.data, raw.nbytes, n, k, out.data_ptr(), out.numel(),
                                  torch.get_num_threads())
    return out


def dequantize_rows(qweight: torch.Tensor, fmt: str, n: int, k: int, tile: int, ids: torch.Tensor) -> torch.Tensor:
    """FP32 rows `ids` [...] of a weight in the runtime layout -> [..., k] (the embedding lookup)."""
    _check_format(fmt)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((flat.numel(), k), dtype=torch.float32)
    _native.quant_rows(fmt, qweight.data_ptr(), readable_elements(qweight), n, k, tile, flat.data_ptr(), flat.numel(),
                       out.data_ptr(), out.numel())
    return out.reshape(*ids.shape, k)


def _check_linear_args(input: torch.Tensor, qweight: torch.Tensor, fmt: str, out_features: int, tile: int,
                       layout_version: int) -> None:
    _check_format(fmt)
    if layout_version != QUANT_LAYOUT_VERSION:
        raise ValueError(f"quantized_linear: quantized layout version {layout_version} is not this build's "
                         f"({QUANT_LAYOUT_VERSION}); repack the weight")
    if input.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"quantized_linear: input must be bfloat16 or float32, got {input.dtype}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 1:
        raise ValueError(f"quantized_linear: qweight must be a 1-D uint8 tensor (the runtime layout), got "
                         f"{qweight.dtype} {tuple(qweight.shape)}")
    k = input.shape[-1]
    if k % BLOCK_K[fmt]:
        raise ValueError(f"quantized_linear: K = {k} is not a whole number of {fmt}'s {BLOCK_K[fmt]}-value blocks")
    want = layout_bytes(fmt, out_features, k, tile)
    if qweight.numel() != want:
        raise ValueError(f"quantized_linear: a {fmt} weight [{out_features}, {k}] with tiles of {tile} takes {want} "
                         f"bytes, qweight has {qweight.numel()}: it was repacked for another shape or tile")


torch.library.define(
    "rvascend::quantized_linear",
    f"(Tensor input, Tensor qweight, str format, SymInt out_features, int tile, "
    f"int layout_version={QUANT_LAYOUT_VERSION}) -> Tensor")


def _linear_cpu(input: torch.Tensor, qweight: torch.Tensor, fmt: str, out_features: int, tile: int,
                layout_version: int = QUANT_LAYOUT_VERSION) -> torch.Tensor:
    _check_linear_args(input, qweight, fmt, out_features, tile, layout_version)
    if input.device.type != "cpu" or qweight.device.type != "cpu":
        raise RuntimeError("quantized_linear: tensors must be on the CPU")
    k = input.shape[-1]
    lead = input.shape[:-1]
    x = row_major(input.reshape(-1, k))
    m = x.shape[0]
    out = torch.empty((m, out_features), dtype=input.dtype)
    if m:
        _native.quant_linear(_kernel_set, fmt, m, out_features, k, x.data_ptr(),
                             x.stride(0) if m > 1 else k, readable_elements(x), qweight.data_ptr(), qweight.numel(),
                             tile, out.data_ptr(), out_features, out.numel(), torch.get_num_threads(),
                             input.dtype == torch.float32)
    return out.reshape(*lead, out_features)


torch.library.impl("rvascend::quantized_linear", "CPU")(_linear_cpu)


@register_fake("rvascend::quantized_linear")
def _linear_fake(input: torch.Tensor, qweight: torch.Tensor, fmt: str, out_features: int, tile: int,
                 layout_version: int = QUANT_LAYOUT_VERSION) -> torch.Tensor:
    _check_linear_args(input, qweight, fmt, out_features, tile, layout_version)
    return input.new_empty((*input.shape[:-1], out_features))


def quantized_linear(input: torch.Tensor, qweight: torch.Tensor, fmt: str, out_features: int, tile: int,
                     layout_version: int = QUANT_LAYOUT_VERSION) -> torch.Tensor:
    """input[..., K] x W^T -> [..., out_features], W quantized in the runtime layout; BF16 or FP32
    activations (FP32 ones are quantized without a BF16 rounding first), output in their dtype."""
    return eager_call(torch.ops.rvascend.quantized_linear, _linear_cpu, input, qweight, fmt, out_features, tile,
                      layout_version)

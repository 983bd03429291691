"""`torch.ops.rvascend.pack_bf16_weight` and `torch.ops.rvascend.packed_bf16_linear`.

Layout version 1 packs a row-major BF16 weight W[N, K] into
P[ceil(N/32), K, 32] with P[b, k, j] = W[b*32 + j, k] and zero rows past N.
The linear op computes input[..., K] x W^T -> [..., N] in FP32 and rounds
once to BF16 (nearest even). Both ops have fake implementations, so they
trace under `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from rvascend.ops.native import load_rvv_kernels

_native = load_rvv_kernels()

LAYOUT_VERSION: int = int(_native.LAYOUT_VERSION)
BLOCK_N: int = int(_native.BLOCK_N)

# Which kernel set the CPU implementation uses: "" = the best available.
# RVASCEND_BF16_KERNELS pins one for a whole process (benchmarks, debugging).
_kernel_set: str = os.environ.get("RVASCEND_BF16_KERNELS", "")


def available_kernel_sets() -> list[str]:
    """Kernel sets this build has and this CPU supports, best first."""
    return list(_native.available_kernel_sets())


def cpu_features() -> str:
    return str(_native.cpu_features())


@contextlib.contextmanager
def use_kernel_set(name: str) -> Iterator[None]:
    """Runs packed_bf16_linear with the kernel set `name` inside the block."""
    global _kernel_set
    if name not in available_kernel_sets():
        raise ValueError(f"kernel set {name!r} is not available here; available: {available_kernel_sets()}")
    previous, _kernel_set = _kernel_set, name
    try:
        yield
    finally:
        _kernel_set = previous


def packed_weight_bytes(out_features: int, in_features: int, element_size: int = 2) -> int:
    """Bytes of a packed weight: ceil(N/32)*32 * K * element_size."""
    return -(-out_features // BLOCK_N) * BLOCK_N * in_features * element_size


def _check_layout_version(layout_version: int) -> None:
    if layout_version != LAYOUT_VERSION:
        raise ValueError(
            f"packed layout version {layout_version} is not supported: this build implements "
            f"version {LAYOUT_VERSION} ([ceil(N/32), K, 32]); re-pack the weight")


def _check_pack_args(weight: torch.Tensor, layout_version: int) -> None:
    _check_layout_version(layout_version)
    if weight.dtype != torch.bfloat16:
        raise TypeError(f"pack_bf16_weight: weight must be bfloat16, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"pack_bf16_weight: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")


def _check_linear_args(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                       layout_version: int) -> None:
    _check_layout_version(layout_version)
    if input.dtype != torch.bfloat16:
        raise TypeError(f"packed_bf16_linear: input must be bfloat16, got {input.dtype}")
    if packed_weight.dtype != torch.bfloat16:
        raise TypeError(f"packed_bf16_linear: packed_weight must be bfloat16, got {packed_weight.dtype}")
    if input.dim() < 1:
        raise ValueError("packed_bf16_linear: input must have at least one dimension [..., K]")
    if packed_weight.dim() != 3 or packed_weight.shape[2] != BLOCK_N:
        raise ValueError(
            f"packed_bf16_linear: packed_weight must have shape [ceil(N/{BLOCK_N}), K, {BLOCK_N}] "
            f"(layout version {LAYOUT_VERSION}), got {tuple(packed_weight.shape)}")
    blocks, k = packed_weight.shape[0], packed_weight.shape[1]
    if input.shape[-1] != k:
        raise ValueError(
            f"packed_bf16_linear: input has K = {input.shape[-1]} features but the packed weight "
            f"has K = {k}")
    if out_features < 1 or out_features > blocks * BLOCK_N:
        raise ValueError(
            f"packed_bf16_linear: out_features = {out_features} does not fit the packed weight's "
            f"{blocks} blocks of {BLOCK_N} rows (at most {blocks * BLOCK_N})")
    if out_features <= (blocks - 1) * BLOCK_N:
        raise ValueError(
            f"packed_bf16_linear: out_features = {out_features} needs {-(-out_features // BLOCK_N)} "
            f"blocks but the packed weight has {blocks}: it was packed for another weight")


def _check_cpu(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise RuntimeError(f"{name}: tensors must be on the CPU, got {t.device}")


torch.library.define(
    "rvascend::pack_bf16_weight", "(Tensor weight, int layout_version=1) -> Tensor")
torch.library.define(
    "rvascend::packed_bf16_linear",
    "(Tensor input, Tensor packed_weight, SymInt out_features, int layout_version=1) -> Tensor")


def _pack_cpu(weight: torch.Tensor, layout_version: int = 1) -> torch.Tensor:
    _check_pack_args(weight, layout_version)
    n, k = weight.shape
    # Rows must not overlap (an expanded weight has row stride 0): anything
    # but unit column stride and row stride >= K packs from a contiguous copy.
    if weight.stride(1) != 1 or (n > 1 and weight.stride(0) < k):
        weight = weight.contiguous()
    packed = torch.empty((-(-n // BLOCK_N), k, BLOCK_N), dtype=torch.bfloat16)
    if n and k:
        _native.pack_bf16_weight(weight.data_ptr(), n, k, weight.stride(0) if n > 1 else k,
                                 readable_elements(weight), packed.data_ptr())
    return packed


def readable_elements(t: torch.Tensor) -> int:
    """Elements of t's storage from its first element on (the C++ side's bound)."""
    return t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()


def _linear_cpu(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                layout_version: int = 1) -> torch.Tensor:
    _check_linear_args(input, packed_weight, out_features, layout_version)
    _check_cpu("packed_bf16_linear", input, packed_weight)
    k = packed_weight.shape[1]
    lead = input.shape[:-1]
    x = input.reshape(-1, k)
    if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) < k):
        x = x.contiguous()
    m = x.shape[0]
    out = torch.empty((m, out_features), dtype=torch.bfloat16)
    if m:
        w = packed_weight if packed_weight.is_contiguous() else packed_weight.contiguous()
        _native.packed_bf16_linear(
            _kernel_set, m, out_features, k, x.data_ptr(), x.stride(0) if m > 1 else k, readable_elements(x),
            w.data_ptr(), readable_elements(w), out.data_ptr(), out_features, out.numel(),
            torch.get_num_threads())
    return out.reshape(*lead, out_features)


FINGERPRINT_SAMPLES = 128


def weight_fingerprint(weight: torch.Tensor, samples: int = FINGERPRINT_SAMPLES) -> int:
    """A content fingerprint of a 2-D BF16 weight from `samples` elements spread
    over its rows and columns; O(samples), whatever the weight's size."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"weight_fingerprint: needs a 2-D BF16 CPU tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    n, k = weight.shape
    return int(_native.weight_fingerprint(weight.data_ptr(), n, k, weight.stride(0), weight.stride(1),
                                          readable_elements(weight), samples))


torch.library.impl("rvascend::pack_bf16_weight", "CPU")(_pack_cpu)
torch.library.impl("rvascend::packed_bf16_linear", "CPU")(_linear_cpu)


def eager_call(op, impl, *args):
    """`impl(*args)` directly when running eagerly, the registered `op` while torch.compile
    traces. The dispatcher's round trip back into a Python kernel costs more than many of
    these ops themselves on a small in-order core (tens of thousands of instructions)."""
    if torch.compiler.is_compiling():
        return op(*args)
    return impl(*args)


def register_fake(name: str):
    """The fake (meta) registration decorator for an op of this package.

    torch >= 2.4 spells it register_fake; impl_abstract serves older builds."""
    register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    return register(name)


@register_fake("rvascend::pack_bf16_weight")
def _pack_fake(weight: torch.Tensor, layout_version: int = 1) -> torch.Tensor:
    _check_pack_args(weight, layout_version)
    n, k = weight.shape
    return weight.new_empty((-(-n // BLOCK_N), k, BLOCK_N))


@register_fake("rvascend::packed_bf16_linear")
def _linear_fake(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                 layout_version: int = 1) -> torch.Tensor:
    _check_linear_args(input, packed_weight, out_features, layout_version)
    return input.new_empty((*input.shape[:-1], out_features))


def pack_bf16_weight(weight: torch.Tensor, layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    """Packs a BF16 [N, K] weight into [ceil(N/32), K, 32] (layout version 1)."""
    return eager_call(torch.ops.rvascend.pack_bf16_weight, _pack_cpu, weight, layout_version)


def packed_bf16_linear(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                       layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    """input[..., K] x W^T -> [..., out_features] (BF16) over a packed weight."""
    return eager_call(torch.ops.rvascend.packed_bf16_linear, _linear_cpu, input, packed_weight, out_features,
                      layout_version)

"""`torch.ops.rvascend.pack_bf16_weight` and `torch.ops.rvascend.packed_bf16_linear`.

Layout version 1 packs a row-major BF16 weight W[N, K] into
P[ceil(N/32), K, 32] with P[b, k, j] = W[b*32 + j, k] and zero rows past N;
every kernel set reads it. Version 2 (RVV's wide kernel set, the default
there) packs P[ceil(N/B), K, B] with B = VLEN/2 and the columns of a k-row
paired: P[b, k, 2t] = W[b*B + t, k], P[b, k, 2t+1] = W[b*B + B/2 + t, k]
(rvv_kernels/linear/packed_layout.h). The linear op computes input[..., K] x W^T -> [..., N] in FP32 and rounds
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

# The layout this machine packs by default (2 where the RVV wide set is the best).
LAYOUT_VERSION: int = int(_native.DEFAULT_LAYOUT_VERSION)
SUPPORTED_LAYOUT_VERSIONS = (1, 2)
BLOCK_N: int = int(_native.BLOCK_N)            # version 1's block
WIDE_BLOCK_N: int = int(_native.WIDE_BLOCK_N)  # version 2's block here (VLEN/2); 0 without RVV
_WIDE_BLOCKS = (64, 128, 256, 512)

# Which kernel set the CPU implementation uses: "" = the best available.
# RVASCEND_BF16_KERNELS pins one for a whole process (benchmarks, debugging).
_kernel_set: str = os.environ.get("RVASCEND_BF16_KERNELS", "")


def available_kernel_sets() -> list[str]:
    """Kernel sets this build has and this CPU supports, best first."""
    return list(_native.available_kernel_sets())


def kernel_set_layout_version(name: str) -> int:
    """The packed layout version a kernel set reads."""
    return 1 if int(_native.kernel_set_block_n(name)) == BLOCK_N else 2


def cpu_features() -> str:
    return str(_native.cpu_features())


def advise_huge_pages(buffer: torch.Tensor) -> bool:
    """Asks the kernel to back a CPU tensor not yet written (a weight about to be loaded or
    packed) with transparent huge pages, where they fit whole (rvv_kernels/base/huge_pages.h:
    a decode step streams every weight, and 4 KiB pages cost it a TLB miss each and stop
    the hardware prefetchers); whether the hint was taken."""
    if buffer.device.type != "cpu":
        return False
    return bool(_native.advise_huge_pages(buffer.data_ptr(), buffer.numel() * buffer.element_size()))


def thread_team() -> str:
    """Which threads run the kernels' parallel sections: "openmp" (torch's OpenMP
    team, on x86) or "own" (the kernels' pool; riscv64, or RVASCEND_THREAD_POOL=own)."""
    return str(_native.thread_team())


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


def block_n(layout_version: int = LAYOUT_VERSION) -> int:
    """The block a weight packed here in `layout_version` gets."""
    _check_layout_version(layout_version)
    if layout_version == 1:
        return BLOCK_N
    if not WIDE_BLOCK_N:
        raise ValueError("packed layout version 2 is packed for an RVV CPU's VLEN (block VLEN/2); this CPU has "
                         f"no kernel set reading it ({cpu_features()}): use version 1")
    return WIDE_BLOCK_N


def packed_weight_bytes(out_features: int, in_features: int, element_size: int = 2,
                        layout_version: int = LAYOUT_VERSION) -> int:
    """Bytes of a packed weight: ceil(N/B)*B * K * element_size with this machine's block B."""
    b = block_n(layout_version)
    return -(-out_features // b) * b * in_features * element_size


def _check_layout_version(layout_version: int) -> None:
    if layout_version not in SUPPORTED_LAYOUT_VERSIONS:
        raise ValueError(
            f"packed layout version {layout_version} is not supported: this build implements versions "
            f"{', '.join(map(str, SUPPORTED_LAYOUT_VERSIONS))} (1: [ceil(N/32), K, 32]; 2: [ceil(N/B), K, B], "
            "B = VLEN/2); re-pack the weight")


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
    blocks_ok = (BLOCK_N,) if layout_version == 1 else _WIDE_BLOCKS
    if packed_weight.dim() != 3 or packed_weight.shape[2] not in blocks_ok:
        want = "[ceil(N/32), K, 32]" if layout_version == 1 else "[ceil(N/B), K, B] with B in 64..512"
        raise ValueError(
            f"packed_bf16_linear: packed_weight must have shape {want} (layout version {layout_version}), "
            f"got {tuple(packed_weight.shape)}")
    blocks, k, b = packed_weight.shape
    if input.shape[-1] != k:
        raise ValueError(
            f"packed_bf16_linear: input has K = {input.shape[-1]} features but the packed weight "
            f"has K = {k}")
    if out_features < 1 or out_features > blocks * b:
        raise ValueError(
            f"packed_bf16_linear: out_features = {out_features} does not fit the packed weight's "
            f"{blocks} blocks of {b} rows (at most {blocks * b})")
    if out_features <= (blocks - 1) * b:
        raise ValueError(
            f"packed_bf16_linear: out_features = {out_features} needs {-(-out_features // b)} "
            f"blocks but the packed weight has {blocks}: it was packed for another weight")


def _check_cpu(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise RuntimeError(f"{name}: tensors must be on the CPU, got {t.device}")


torch.library.define(
    "rvascend::pack_bf16_weight", f"(Tensor weight, int layout_version={LAYOUT_VERSION}) -> Tensor")
torch.library.define(
    "rvascend::packed_bf16_linear",
    f"(Tensor input, Tensor packed_weight, SymInt out_features, int layout_version={LAYOUT_VERSION}) -> Tensor")


def _pack_cpu(weight: torch.Tensor, layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    _check_pack_args(weight, layout_version)
    n, k = weight.shape
    weight = row_major(weight)
    b = block_n(layout_version)
    packed = torch.empty((-(-n // b), k, b), dtype=torch.bfloat16)
    if n and k:
        _native.pack_bf16_weight(weight.data_ptr(), n, k, weight.stride(0) if n > 1 else k,
                                 readable_elements(weight), packed.data_ptr(), b)
    return packed


def row_major(t: torch.Tensor) -> torch.Tensor:
    """A 2-D t with unit column stride and rows that do not overlap (row stride at least its
    width), as the kernels read it: t itself when it has them, else a contiguous copy (an
    expanded tensor's row stride is 0)."""
    return t if t.stride(-1) == 1 and (t.shape[0] <= 1 or t.stride(0) >= t.shape[1]) else t.contiguous()


def readable_elements(t: torch.Tensor) -> int:
    """Elements of t's storage from its first element on (the C++ side's bound)."""
    return t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()


def _linear_cpu(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    _check_linear_args(input, packed_weight, out_features, layout_version)
    _check_cpu("packed_bf16_linear", input, packed_weight)
    k = packed_weight.shape[1]
    lead = input.shape[:-1]
    x = row_major(input.reshape(-1, k))
    m = x.shape[0]
    out = torch.empty((m, out_features), dtype=torch.bfloat16)
    if m:
        w = packed_weight if packed_weight.is_contiguous() else packed_weight.contiguous()
        _native.packed_bf16_linear(
            _kernel_set, m, out_features, k, x.data_ptr(), x.stride(0) if m > 1 else k, readable_elements(x),
            w.data_ptr(), readable_elements(w), w.shape[2], out.data_ptr(), out_features, out.numel(),
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


def fingerprint_descriptor_row(weight: torch.Tensor, fingerprint: int) -> list[int]:
    """One weight's row of `weight_fingerprints_match`'s int64 descriptor: (data pointer,
    N, K, row stride, column stride, readable elements, the fingerprint it must still have,
    as a signed int64)."""
    signed = fingerprint - (1 << 64) if fingerprint >= 1 << 63 else fingerprint
    return [weight.data_ptr(), weight.shape[0], weight.shape[1], weight.stride(0), weight.stride(1),
            readable_elements(weight), signed]


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
def _pack_fake(weight: torch.Tensor, layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    _check_pack_args(weight, layout_version)
    n, k = weight.shape
    b = block_n(layout_version)
    return weight.new_empty((-(-n // b), k, b))


@register_fake("rvascend::packed_bf16_linear")
def _linear_fake(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                 layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    _check_linear_args(input, packed_weight, out_features, layout_version)
    return input.new_empty((*input.shape[:-1], out_features))


def pack_bf16_weight(weight: torch.Tensor, layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    """Packs a BF16 [N, K] weight in `layout_version` (default: this machine's best)."""
    return eager_call(torch.ops.rvascend.pack_bf16_weight, _pack_cpu, weight, layout_version)


def packed_bf16_linear(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int,
                       layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    """input[..., K] x W^T -> [..., out_features] (BF16) over a packed weight."""
    return eager_call(torch.ops.rvascend.packed_bf16_linear, _linear_cpu, input, packed_weight, out_features,
                      layout_version)


def pack_bf16_weight_in_place(weight: torch.Tensor, layout_version: int = LAYOUT_VERSION,
                              scratch_bytes: int = 8 << 20) -> torch.Tensor:
    """Packs a contiguous BF16 [N, K] weight, N a multiple of the layout's block, into its
    own storage and returns the packed [N/B, K, B] view of it: blocks of rows go through a
    scratch copy of at most `scratch_bytes`, so no second copy of the weight ever exists.
    The weight's row-major contents are gone: only for a weight nothing else reads."""
    _check_pack_args(weight, layout_version)
    n, k = weight.shape
    b = block_n(layout_version)
    if n % b or not weight.is_contiguous() or weight.device.type != "cpu":
        raise ValueError(f"pack_bf16_weight_in_place: needs a contiguous CPU weight whose {n} rows are a multiple "
                         f"of the block {b}")
    blocks = n // b
    per = max(1, min(blocks, scratch_bytes // max(1, b * k * weight.element_size())))
    scratch = torch.empty((per * b, k), dtype=torch.bfloat16)
    rows_of = weight.view(blocks, b * k)
    for start in range(0, blocks, per):
        rows = (min(start + per, blocks) - start) * b
        scratch[:rows].copy_(weight[start * b:start * b + rows])
        _native.pack_bf16_weight(scratch.data_ptr(), rows, k, k, scratch.numel(), rows_of[start].data_ptr(), b)
    return weight.view(blocks, k, b)


def unpack_bf16_weight(packed_weight: torch.Tensor, out_features: int,
                       layout_version: int = LAYOUT_VERSION) -> torch.Tensor:
    """The row-major [out_features, K] weight a packed one was made from (exact: packing
    only moves elements). A new contiguous tensor; the policy's drop-unpacked mode
    serves state_dict() and the calls no packed kernel takes with it."""
    _check_layout_version(layout_version)
    if packed_weight.dtype != torch.bfloat16 or packed_weight.dim() != 3:
        raise ValueError(f"unpack_bf16_weight: needs a packed BF16 [blocks, K, B] weight, got {packed_weight.dtype} "
                         f"{tuple(packed_weight.shape)}")
    blocks, k, b = packed_weight.shape
    if not (blocks - 1) * b < out_features <= blocks * b:
        raise ValueError(f"unpack_bf16_weight: out_features = {out_features} does not match the packed weight's "
                         f"{blocks} blocks of {b} rows")
    if layout_version == 1:
        rows = packed_weight.permute(0, 2, 1)
    else:
        # P[b, k, 2t] holds row b*B + t, P[b, k, 2t + 1] row b*B + B/2 + t.
        rows = packed_weight.reshape(blocks, k, b // 2, 2).permute(0, 3, 2, 1)
    return rows.reshape(blocks * b, k)[:out_features].contiguous()

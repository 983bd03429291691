"""GGML formats kept quantized by widening them, without loss, into a kept format.

Q5_0 stores a block of 32 weights as an FP16 scale d and 5-bit codes q in [0, 31]; a
weight is (q - 16) * d. The integer q - 16 fits in int8, so the same block written as
Q8_0 (the same d, the codes as int8) holds exactly the same weights, and the Q8_0
kernels compute exactly what a Q5_0 kernel would (an integer dot product with the int8
activations, times the two scales). It reads 34 bytes per block where Q5_0 reads 22,
against 64 for the BF16 it was dequantized to before. llama.cpp's K-quant files fall
back to Q5_0 for every matrix whose rows are not whole 256-value super-blocks (all of
SmolLM2-135M's Q4_K_M attention and MLP matrices, width 576).
"""

from __future__ import annotations

import numpy as np

# GGML type id (6: Q5_0) -> the kept format it is widened into.
WIDENED = {6: "Q8_0"}

_Q5_0_BYTES, _Q8_0_BYTES = 22, 34
_SLAB_BLOCKS = 1 << 16  # blocks widened at a time: bounds the temporaries to a few MiB


def widen(raw: np.ndarray, type_id: int) -> np.ndarray:
    """The kept format's blocks (uint8 [rows, blocks * its block bytes]) of GGML blocks of
    type `type_id` given as uint8 [rows, blocks * block bytes]."""
    if type_id not in WIDENED:
        raise ValueError(f"GGML type {type_id} is not widened into a kept format")
    return _q5_0_to_q8_0(raw)


def _q5_0_to_q8_0(raw: np.ndarray) -> np.ndarray:
    if raw.ndim != 2 or raw.dtype != np.uint8 or raw.shape[1] % _Q5_0_BYTES:
        raise ValueError(f"Q5_0 rows must be uint8 [rows, a multiple of {_Q5_0_BYTES} bytes], "
                         f"got {raw.dtype} {raw.shape}")
    rows, blocks = raw.shape[0], raw.shape[1] // _Q5_0_BYTES
    src = raw.reshape(rows * blocks, _Q5_0_BYTES)
    out = np.empty((rows * blocks, _Q8_0_BYTES), dtype=np.uint8)
    shifts = np.arange(32, dtype=np.uint32)
    for b0 in range(0, rows * blocks, _SLAB_BLOCKS):
        s = src[b0:b0 + _SLAB_BLOCKS]
        # Layout of a Q5_0 block: d (FP16), qh (32 high bits, little-endian), qs[16]:
        # weight j < 16 is the low nibble of qs[j], weight j + 16 its high nibble; the
        # fifth bit of weight j is bit j of qh.
        qh = s[:, 2:6].astype(np.uint32) << np.array([0, 8, 16, 24], dtype=np.uint32)
        high = ((np.bitwise_or.reduce(qh, axis=1)[:, None] >> shifts) & 1).astype(np.uint8) << 4
        qs = s[:, 6:22]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | high
        o = out[b0:b0 + _SLAB_BLOCKS]
        o[:, 0:2] = s[:, 0:2]
        o[:, 2:] = (codes.astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    return out.reshape(rows, blocks * _Q8_0_BYTES)

"""A model's own weights, quantized in memory: the draft model of
`--speculative-draft-model-quantization` (engine/standalone_draft.py), with no second file.

The embedding, every projection of its decoder layers and the lm_head become quantized
modules (quantized_layers.py) in Q4_0 or Q8_0, quantized here as llama.cpp's reference
quantizer does (bit for bit: quantized_copy_test), a block of rows at a time, and
repacked into the runtime layout; a matrix already quantized (a GGUF kept quantized) is
quantized from its values. The norms are the model's own tensors. The embedding is not
shared: under the kernels' policy a tied target's embedding is its packed lm_head, its
row-major copy dropped. It is made before the policy is installed on either model, so
each gets its own routes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rvascend.models.decoder import CausalLM
from rvascend.models.loader import no_weight_init
from rvascend.models.quantized_layers import ROUTE_ATTR, QuantizedEmbedding, QuantizedLinear, QuantPart
from rvascend.ops import quantized_linear as qops

FORMATS = ("q4_0", "q8_0")
_BLOCK = 32


def quantize_ggml(weight: np.ndarray, fmt: str) -> np.ndarray:
    """The GGML blocks (uint8 [rows, bytes per row]) of an FP32 weight [rows, k], as
    llama.cpp's reference quantizer makes them: Q4_0 scales the block's value of largest
    magnitude to -8 (codes floor(x / d + 8.5), at most 15), Q8_0 its largest magnitude to
    127 (codes rounded half away from zero); the scale is stored as FP16."""
    if fmt not in FORMATS:
        raise ValueError(f"in-memory quantization makes {', '.join(FORMATS)}, not {fmt!r}")
    w = np.ascontiguousarray(weight, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % _BLOCK:
        raise ValueError(f"a weight to quantize is [rows, k] with k a multiple of {_BLOCK}, not {w.shape}")
    rows, k = w.shape
    blocks = w.reshape(rows, k // _BLOCK, _BLOCK)
    if fmt == "q4_0":
        at = np.abs(blocks).argmax(-1)[..., None]  # the first of the largest magnitude
        d = np.take_along_axis(blocks, at, -1)[..., 0] / np.float32(-8)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        codes = np.minimum(np.float32(15), np.trunc(blocks * inv[..., None] + np.float32(8.5))).astype(np.uint8)
        payload = codes[..., :16] | (codes[..., 16:] << 4)
    else:
        d = np.abs(blocks).max(-1) / np.float32(127)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        x = blocks * inv[..., None]
        payload = np.trunc(x + np.copysign(np.float32(0.5), x)).astype(np.int8).view(np.uint8)
    scale = d.astype(np.float16).view(np.uint8).reshape(rows, k // _BLOCK, 2)
    return np.concatenate([scale, payload], axis=-1).reshape(rows, -1)


def quantized_copy(model: CausalLM, fmt: str) -> CausalLM:
    """A model of `model`'s weights with the embedding, every decoder-layer projection and
    the lm_head in `fmt` (FORMATS; a tied lm_head is the embedding's table, as in a GGUF),
    the norms and rotary tables shared; attention-only models (a draft model's kind)."""
    if fmt not in FORMATS:
        raise ValueError(f"--speculative-draft-model-quantization {fmt!r}: expected one of {', '.join(FORMATS)}")
    config = model.config
    if config.linear_attention is not None:
        raise ValueError(f"{config.architecture} has recurrent layers: only attention-only models are quantized "
                         "in memory (a draft model's kind)")
    if any(ROUTE_ATTR in m.__dict__ for m in model.modules()):
        raise ValueError("quantized_copy runs before the kernels' policy is installed (each model gets its own routes)")
    tile = qops.quant_tile()
    with torch.device("meta"), no_weight_init():
        copy = type(model)(config)
    embed = model.model.embed_tokens
    dtype = embed.dtype if isinstance(embed, QuantizedEmbedding) else embed.weight.dtype
    table = QuantizedEmbedding(config.vocab_size, config.hidden_size, fmt.upper(), tile, dtype)
    table.set_part(0, _packed(embed, fmt, tile, "model.embed_tokens"))
    # Not shared: the kernels' policy packs or drops the target's embedding as its tied lm_head.
    copy.model.embed_tokens = table
    copy.lm_head = table if config.tie_word_embeddings else _quantized(model.lm_head, fmt, tile, "lm_head")
    for name, module in model.model.named_modules():
        path = f"model.{name}" if name else "model"
        if name.startswith("layers.") and isinstance(module, (nn.Linear, QuantizedLinear)):
            _replace(copy, path, _quantized(module, fmt, tile, path))
        elif name != "embed_tokens":
            _share(copy.get_submodule(path), module)
    copy.rotary.__init__(config)  # made on meta, it holds no values
    left = [n for n, t in [*copy.named_parameters(), *copy.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"quantized_copy: {type(model).__name__} has weights it does not know: {', '.join(left[:4])}")
    return copy.eval()


_ROWS_AT_ONCE = 1024  # rows quantized together: FP32 temporaries of a few MiB, not of the whole matrix


def _packed(module: nn.Module, fmt: str, tile: int, name: str) -> torch.Tensor:
    """`module`'s matrix (a Linear's, an embedding table, or a quantized one's values) in
    `fmt`'s runtime layout, quantized a block of rows at a time."""
    rows, k = _shape(module)
    if k % _BLOCK:
        raise ValueError(f"--speculative-draft-model-quantization {fmt}: {name}'s rows of {k} values are not whole "
                         f"{_BLOCK}-value blocks; this model cannot draft in {fmt}")
    raw = np.concatenate([quantize_ggml(_rows_f32(module, r, min(rows, r + _ROWS_AT_ONCE)), fmt)
                          for r in range(0, rows, _ROWS_AT_ONCE)])
    return qops.repack_ggml(raw, fmt.upper(), rows, k, tile)


def _rows_f32(module: nn.Module, start: int, end: int) -> np.ndarray:
    if isinstance(module, QuantizedLinear):
        return module.dequantized_weight(torch.float32, start, end).numpy()
    return module.weight.detach()[start:end].float().numpy()


def _shape(module: nn.Module) -> tuple[int, int]:
    """(rows, values a row) of a Linear's, an embedding's or a quantized module's matrix."""
    if isinstance(module, QuantizedLinear):
        return module.out_features, module.in_features
    return tuple(module.weight.shape)


def _quantized(module: nn.Module, fmt: str, tile: int, name: str) -> QuantizedLinear:
    """`module`'s matrix in `fmt` as a quantized projection, its bias kept."""
    rows, k = _shape(module)
    out = QuantizedLinear(k, [QuantPart(fmt.upper(), rows, tile)], bias=getattr(module, "bias", None) is not None)
    out.set_part(0, _packed(module, fmt, tile, name))
    if out.bias is not None:
        out.bias = module.bias
    return out


def _share(mine: nn.Module, theirs: nn.Module) -> None:
    """`mine`'s own parameters and buffers become `theirs`' (the same tensors)."""
    if type(mine) is not type(theirs):
        raise ValueError(f"cannot share {type(theirs).__name__}'s weights with a {type(mine).__name__}")
    for table, source in ((mine._parameters, theirs._parameters), (mine._buffers, theirs._buffers)):
        for key in list(table):
            table[key] = source[key]


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)

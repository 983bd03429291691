"""Loading a GGUF file's quantized projections and embedding as they are.

Every projection (qkv_proj, o_proj, gate_up_proj, down_proj, lm_head; a Gated DeltaNet
layer's in_proj and out_proj) and the token
embedding whose GGUF tensors are all in a kept format (ops/quantized_linear.py)
becomes a quantized module (quantized_layers.py): its GGML blocks are repacked
once, from the mapped file, into the runtime layout, with no dequantized copy at
any point. A fused projection with a shard of any other type is dequantized to
the serving dtype as before, whole; so is every other tensor. `load_model` calls
this on the model still on the meta device, before any weight is allocated.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch
from absl import logging
from torch import nn

from rvascend.models import gguf_checkpoint
from rvascend.models.decoder import CausalLM
from rvascend.models.layers import FusedLinear
from rvascend.models.quantized_layers import QuantizedEmbedding, QuantizedLinear, QuantPart
from rvascend.ops import quantized_linear as qops


@dataclasses.dataclass
class _Module:
    path: str                       # module path in the model
    shards: dict[str, tuple[str, str]]  # shard (or "") -> (GGUF weight name, format)
    bias: dict[str, str] = dataclasses.field(default_factory=dict)  # shard -> GGUF bias name


def _plan(ckpt: gguf_checkpoint.GgufCheckpoint, model: CausalLM) -> list[_Module]:
    modules: dict[str, _Module] = {}
    stacked = type(model).STACKED  # the family's fused projections (Qwen3.5's in_proj too)
    for name in ckpt.type_names():
        hf = ckpt.hf_name(name)
        if hf is None or not hf.endswith((".weight", ".bias")):
            continue
        parts = hf.rsplit(".", 2)
        path, leaf, param = ".".join(hf.split(".")[:-1]), hf.split(".")[-2], parts[-1]
        shard = ""
        if leaf in stacked:
            fused, shard = stacked[leaf]
            path = path.rsplit(".", 1)[0] + "." + fused
        elif leaf not in ("o_proj", "out_proj", "down_proj", "lm_head", "embed_tokens"):
            continue
        entry = modules.setdefault(path, _Module(path, {}))
        if param == "bias":
            entry.bias[shard] = name
        else:
            entry.shards[shard] = (name, ckpt.kept_format(name))
    planned = []
    for entry in modules.values():
        module = model.get_submodule(entry.path)
        want = list(module.shard_offsets) if isinstance(module, FusedLinear) else [""]
        if sorted(entry.shards) == sorted(want) and all(fmt for _, fmt in entry.shards.values()):
            entry.shards = {s: entry.shards[s] for s in want}  # the module's row order
            planned.append(entry)
    return planned


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def install_quantized_modules(model: CausalLM, ckpt: gguf_checkpoint.GgufCheckpoint,
                              dtype: torch.dtype) -> tuple[frozenset, list]:
    """Replaces, on the meta-device model, every module that stays quantized; returns the
    GGUF tensor names they take over and the loaders to run once the model is on the CPU."""
    tile = qops.quant_tile()
    consumed, loaders = set(), []
    embed = model.model.embed_tokens
    for entry in _plan(ckpt, model):
        old = model.get_submodule(entry.path)
        shard_rows = dict((s, r) for s, (_, r) in old.shard_offsets.items()) if isinstance(old, FusedLinear) \
            else {"": old.weight.shape[0]}
        if old is embed:
            name, fmt = entry.shards[""]
            new = QuantizedEmbedding(old.num_embeddings, old.embedding_dim, fmt, tile, dtype)
        else:
            parts: list[QuantPart] = []
            groups: list[list[str]] = []
            for s, (_, fmt) in entry.shards.items():
                if parts and parts[-1].fmt == fmt:
                    parts[-1] = QuantPart(fmt, parts[-1].rows + shard_rows[s], tile)
                    groups[-1].append(s)
                else:
                    parts.append(QuantPart(fmt, shard_rows[s], tile))
                    groups.append([s])
            new = QuantizedLinear(old.in_features, parts, bias=getattr(old, "bias", None) is not None)
        _replace(model, entry.path, new)
        if old is embed and model.lm_head is old:
            model.lm_head = new  # the tie: one module, one quantized table
        consumed |= {name for name, _ in entry.shards.values()} | set(entry.bias.values())
        loaders.append((entry, new))
    return frozenset(consumed), loaders


def load_quantized_modules(ckpt: gguf_checkpoint.GgufCheckpoint, loaders: list, dtype: torch.dtype) -> list[str]:
    """Repacks every planned module's GGML blocks into its buffers; returns the Hugging
    Face parameter names they provide (for the loader's completeness check)."""
    provided = []
    for entry, module in loaders:
        k = module.in_features
        shard_names = list(entry.shards)
        i = 0
        for p_index, part in enumerate(module.parts):
            rows, names = 0, []
            while rows < part.rows:
                gguf_name, _ = entry.shards[shard_names[i]]
                names.append(gguf_name)
                rows += ckpt.row_count(gguf_name)
                i += 1
            raw = ckpt.quantized_rows(names[0]) if len(names) == 1 else \
                np.concatenate([ckpt.quantized_rows(n) for n in names])
            try:
                packed = qops.repack_ggml(raw, part.fmt, part.rows, k, part.tile)
            except ValueError as e:  # a corrupt scale: name the file and its tensors (rows are the part's)
                raise gguf_checkpoint.GgufError(f"{ckpt.path}: {' + '.join(names)}: {e}") from None
            module.set_part(p_index, packed)
            del raw
            for name in names:
                ckpt.release(name)
        if entry.bias:
            values = dict(ckpt.tensors(torch.float32, skip=frozenset(ckpt.type_names()) - set(entry.bias.values())))
            order = [f"{ckpt.hf_name(entry.bias[s])}" for s in shard_names]
            with torch.no_grad():
                module.bias.copy_(torch.cat([values[n] for n in order]).to(module.bias.dtype))
        for s in shard_names:
            provided.append(ckpt.hf_name(entry.shards[s][0]))
            if s in entry.bias:
                provided.append(ckpt.hf_name(entry.bias[s]))
        logging.debug("kept quantized: %s %s", entry.path, [(p.fmt, p.rows) for p in module.parts])
    return provided


def report(model: nn.Module) -> Optional[str]:
    """One line naming what stayed quantized (None if nothing did)."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]
    if not mods:
        return None
    fmts: dict[str, int] = {}
    for _, m in mods:
        for p in m.parts:
            fmts[p.fmt] = fmts.get(p.fmt, 0) + 1
    size = sum(m.packed_bytes for _, m in mods)
    return (f"kept quantized: {len(mods)} modules ({', '.join(f'{c} x {f}' for f, c in sorted(fmts.items()))}), "
            f"{size / 2**20:.1f} MiB in the runtime layout (tiles of {mods[0][1].parts[0].tile} columns)")

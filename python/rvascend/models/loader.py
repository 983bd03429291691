"""Loads a checkpoint into a CausalLM: a Hugging Face directory (config.json +
*.safetensors) or a GGUF file (gguf_checkpoint.py)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn

from absl import logging

from rvascend.models import gguf_checkpoint, quantized_load
from rvascend.models.config import ModelConfig
from rvascend.models.decoder import CausalLM
from rvascend.models.layers import FusedLinear
from rvascend.models.quantized_layers import QuantizedLinear
from rvascend.models.registry import model_class_for
from rvascend.ops.packed_linear import advise_huge_pages


def weight_files(model_path: str) -> list[str]:
    """The checkpoint's safetensors files (sharded checkpoints through their index)."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        paths = [os.path.join(model_path, name) for name in files]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"weight shard(s) listed in the index are missing: {', '.join(missing)}")
        return paths
    paths = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not paths:
        raise FileNotFoundError(f"{model_path} has no *.safetensors weight files")
    return paths


def _safetensors(model_path: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor but those whose names start with one of `skip` (never read)."""
    for path in weight_files(model_path):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                if not name.startswith(skip):
                    yield name, f.get_tensor(name)


def load_model(model_path: str, dtype: torch.dtype = torch.bfloat16, keep_quantized: bool = False,
               mtp: bool = False) -> CausalLM:
    """The model of a checkpoint directory or GGUF file, in `dtype`, in eval mode. With
    `keep_quantized`, a GGUF file's projections and embedding in a kept format
    (ops/quantized_linear.FORMATS) stay quantized (models/quantized_load.py); everything
    else is `dtype`, one log line per dequantized GGML type naming its cost. With
    `mtp`, a Qwen3.5 checkpoint's multi-token-prediction head is loaded too (model.mtp,
    the NEXTN draft model); without, its tensors are never read."""
    gguf_file = gguf_checkpoint.GgufCheckpoint(model_path) if gguf_checkpoint.is_gguf(model_path) else None
    try:
        model = _load(model_path, gguf_file, dtype, keep_quantized, mtp)
    except BaseException:
        if gguf_file is not None:
            gguf_file.close(after_error=True)  # never hides the error with mmap's BufferError
        raise
    if gguf_file is not None:
        gguf_file.close()  # the map's pages leave RSS with it
    return model


def _load(model_path: str, gguf_file, dtype: torch.dtype, keep_quantized: bool, mtp: bool) -> CausalLM:
    config = ModelConfig.from_dict(gguf_file.config) if gguf_file else ModelConfig.from_dir(model_path)
    cls = model_class_for(config.architecture)
    if mtp and gguf_file is not None:
        raise ValueError("an MTP head is loaded from safetensors checkpoints only, not from a GGUF file")
    with torch.device("meta"), no_weight_init():
        model = cls(config)
        if mtp:
            from rvascend.models import qwen3_5_mtp  # only then: it imports the Qwen3.5 model

            qwen3_5_mtp.add_mtp_head(model)
    consumed, loaders = frozenset(), []
    if gguf_file is not None and keep_quantized:
        consumed, loaders = quantized_load.install_quantized_modules(model, gguf_file, dtype)
    _materialize(model, dtype)
    model.rotary.__init__(config)  # buffers made on meta hold no values
    params = dict(model.named_parameters())
    loaded: set[str] = set(quantized_load.load_quantized_modules(gguf_file, loaders, dtype)) if loaders else set()
    release = gguf_file.release_view if gguf_file else None
    if gguf_file:
        tensors = gguf_file.tensors(dtype, skip=consumed, view=True)
    elif config.multimodal_source:
        tensors = _text_model_tensors(model_path, config, mtp)
    else:
        tensors = _safetensors(model_path, skip=() if mtp else _MTP)
    for name, tensor in tensors:
        _load_tensor(model, params, name, tensor, loaded, release)
    expected = {n for n in params if not _is_quantized_bias(model, n)} | set(loaded)
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    # A fused parameter counts as loaded only when every one of its shards was.
    for module_path, module in model.named_modules():
        if isinstance(module, FusedLinear):
            for param, _ in module.named_parameters(recurse=False):
                full = f"{module_path}.{param}"
                shards = [f"{full}#{s}" for s in module.shard_offsets]
                if all(s in loaded for s in shards):
                    loaded.add(full)
                else:
                    expected |= {s for s in shards if s not in loaded}
                    expected.discard(full)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint {model_path} lacks tensors: {', '.join(missing[:8])}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    line = quantized_load.report(model)
    if line:
        logging.info("%s", line)
    for line in gguf_file.dequantized_report(consumed, dtype) if gguf_file else ():
        logging.info("%s", line)
    return model.eval()


_TEXT_PREFIX = "model.language_model."
_VISION = ("model.visual.",)
_MTP = ("mtp.",)  # the multi-token-prediction head, read only when asked for


def _text_model_tensors(model_path: str, config: ModelConfig, mtp: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """An image-text checkpoint's text model tensors under the text model's names (and with
    `mtp`, the MTP head's); the vision tower's are never read."""
    logging.info("%s checkpoint: serving its text model (%s); the vision tower is not loaded%s",
                 config.multimodal_source, config.architecture, "" if mtp else ", nor the MTP head")
    for name, tensor in _safetensors(model_path, skip=_VISION if mtp else _VISION + _MTP):
        yield ("model." + name[len(_TEXT_PREFIX):] if name.startswith(_TEXT_PREFIX) else name), tensor


def _materialize(model: nn.Module, dtype: torch.dtype) -> None:
    """Gives every meta parameter and buffer uninitialised CPU memory, floating ones in
    `dtype`: not `to_empty().to(dtype)`, which first made the default dtype's copy of every
    weight, nor `to(dtype).to_empty()`, whose meta kernels import sympy (40 MiB)."""
    made: dict[int, torch.Tensor] = {}  # a tensor shared by two modules stays one

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            data = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="cpu")
            advise_huge_pages(data)  # before the weights are written into it
            made[id(t)] = nn.Parameter(data, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else data
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and t.is_meta:
                    table[name] = empty(t)


@contextlib.contextmanager
def no_weight_init() -> Iterator[None]:
    """Module constructors without their weight initialisation, which the checkpoint
    overwrites: on meta tensors it runs PyTorch's Python reference kernels, whose first
    use imports torch._dynamo (70 MiB of RSS, in a server that may never compile)."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_", "trunc_normal_", "zeros_", "ones_",
             "constant_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _is_quantized_bias(model: CausalLM, name: str) -> bool:
    """A quantized module's bias is loaded with its module (named by its shards)."""
    module_path, _, leaf = name.rpartition(".")
    return leaf == "bias" and isinstance(model.get_submodule(module_path), QuantizedLinear)


def _load_tensor(model: CausalLM, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor,
                 loaded: set[str], release=None) -> None:
    if name.endswith("rotary_emb.inv_freq"):
        return
    if name == "lm_head.weight" and model.config.tie_word_embeddings:
        return  # some tied checkpoints still store it; the embedding is authoritative
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in type(model).STACKED:
            fused_name, shard = type(model).STACKED[part]
            module_path = ".".join(parts[:i] + [fused_name])
            module = model.get_submodule(module_path)
            assert isinstance(module, FusedLinear)
            param = parts[-1]
            module.load_shard(param, shard, tensor)
            loaded.add(f"{module_path}.{param}#{shard}")
            return
    if name not in params:
        raise ValueError(f"unexpected tensor {name!r} in the checkpoint (architecture {model.config.architecture})")
    target = params[name]
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}")
    with torch.no_grad():
        _copy_in_slabs(target, tensor, release)
    loaded.add(name)


def _copy_in_slabs(target: torch.Tensor, tensor: torch.Tensor, release) -> None:
    """target.copy_(tensor), 16 MiB of rows at a time, each slab's source released once
    copied (`release`: a view of a GGUF file's map): the file's pages of a tensor and the
    model's copy of it are never both resident whole (Qwen3-0.6B's embedding: 297 MiB of
    the load's peak)."""
    if release is None or tensor.dim() == 0 or tensor.shape[0] == 0:
        target.copy_(tensor)
        return
    step = max(1, (16 << 20) // max(1, tensor[0].numel() * tensor.element_size()))
    for r0 in range(0, tensor.shape[0], step):
        target[r0:r0 + step].copy_(tensor[r0:r0 + step])
        release(tensor[r0:r0 + step])

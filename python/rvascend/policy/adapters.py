"""Model adapters: where a model family keeps its projections, embedding and lm_head.

An engine integration only has to name its modules; the policy does the rest.
Two naming schemes cover the supported families (Llama, Qwen2, Qwen3):
fused SGLang/vLLM-style modules (this project's engine), and Hugging Face
transformers' separate q/k/v and gate/up modules.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    name: str
    suffixes: dict[str, str]  # last name component -> projection kind

    def projection_of(self, module_name: str) -> Optional[str]:
        return self.suffixes.get(module_name.rsplit(".", 1)[-1])

    def projections(self, model: nn.Module) -> list[tuple[str, nn.Module, str]]:
        """(module name, module, projection kind) in registration order; lm_head last."""
        found = []
        seen: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            kind = self.projection_of(name)
            weighted = isinstance(getattr(module, "weight", None), torch.Tensor) or \
                hasattr(module, "quantized_linear")  # weights kept quantized (models/quantized_layers.py)
            if kind is None or id(module) in seen or not weighted:
                continue
            seen.add(id(module))
            found.append((name, module, kind))
        found.sort(key=lambda item: item[2] == "lm_head")
        return found


FUSED = ModelAdapter("fused", {
    "qkv_proj": "qkv_proj", "o_proj": "o_proj", "gate_up_proj": "gate_up_proj",
    "down_proj": "down_proj", "lm_head": "lm_head",
    # Gated DeltaNet layers (models/qwen3_5.py): q/k/v/z/b/a fused, and the output projection.
    "in_proj": "in_proj", "out_proj": "out_proj",
    # Qwen3.5's MTP head (models/qwen3_5_mtp.py): its input projection and its draft vocabulary's rows.
    "fc": "mtp_fc", "draft_head": "draft_head",
})

TRANSFORMERS = ModelAdapter("transformers", {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj",
    "lm_head": "lm_head",
})

ADAPTERS: dict[str, ModelAdapter] = {a.name: a for a in (FUSED, TRANSFORMERS)}


def select_adapter(model: nn.Module) -> ModelAdapter:
    names = [name.rsplit(".", 1)[-1] for name, _ in model.named_modules()]
    if "qkv_proj" in names or "gate_up_proj" in names:
        return FUSED
    if "q_proj" in names or "gate_proj" in names:
        return TRANSFORMERS
    raise ValueError(
        "no adapter recognises this model: expected fused (qkv_proj, gate_up_proj) or "
        "transformers-style (q_proj, gate_proj) projection modules")


def _first(model: nn.Module, getters: list[Callable[[nn.Module], Optional[nn.Module]]]) -> Optional[nn.Module]:
    for get in getters:
        try:
            found = get(model)
        except (AttributeError, NotImplementedError):
            continue
        if found is not None:
            return found
    return None


def embed_tokens(model: nn.Module) -> Optional[nn.Module]:
    return _first(model, [lambda m: m.model.embed_tokens, lambda m: m.embed_tokens,
                          lambda m: m.get_input_embeddings()])


def lm_head(model: nn.Module) -> Optional[nn.Module]:
    return _first(model, [lambda m: m.lm_head, lambda m: m.get_output_embeddings()])


def ties_word_embeddings(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    if config is None:
        return False
    if isinstance(config, dict):
        return bool(config.get("tie_word_embeddings", False))
    return bool(getattr(config, "tie_word_embeddings", False))

"""Architecture names (config.json `architectures[0]`) this engine serves."""

from __future__ import annotations

from torch import nn

from rvascend.models.decoder import CausalLM
from rvascend.models.qwen3_5 import Qwen3_5CausalLM

MODEL_ARCHITECTURES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": CausalLM,
    "Qwen2ForCausalLM": CausalLM,
    "Qwen3ForCausalLM": CausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5CausalLM,
}


def model_class_for(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(MODEL_ARCHITECTURES))}"
        ) from None

"""The model class of each family this engine serves (models/families.py), by its
config.json architecture name."""

from __future__ import annotations

from torch import nn

from rvascend.models.decoder import CausalLM
from rvascend.models.families import FAMILIES, family_of
from rvascend.models.qwen3_5 import Qwen3_5CausalLM

MODEL_ARCHITECTURES: dict[str, type[nn.Module]] = {
    f.architecture: Qwen3_5CausalLM if f.hybrid else CausalLM for f in FAMILIES}


def model_class_for(architecture: str) -> type[nn.Module]:
    return MODEL_ARCHITECTURES[family_of(architecture).architecture]

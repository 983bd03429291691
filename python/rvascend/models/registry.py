"""The model class of each family this engine serves (models/families.py), by its
config.json architecture name."""

from __future__ import annotations

from torch import nn

from rvascend.models.decoder import CausalLM
from rvascend.models.families import family_of
from rvascend.models.qwen3_5 import Qwen3_5CausalLM


def model_class_for(architecture: str) -> type[nn.Module]:
    """Qwen3.5's layer kinds for a hybrid family, the dense decoder for the others; a name
    no family has is refused (families.family_of)."""
    return Qwen3_5CausalLM if family_of(architecture).hybrid else CausalLM

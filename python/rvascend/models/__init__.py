"""Decoder-only model families served by the engine (models/families.py: Llama, Qwen2,
Qwen3, Qwen3.5).

Owns the module structure with fused `qkv_proj` and `gate_up_proj`, the
stacked loading of q/k/v and gate/up shards, and the architecture registry.
"""

from rvascend.models.registry import model_class_for

__all__ = ["model_class_for"]

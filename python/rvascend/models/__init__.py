"""Decoder-only model families served by the engine (Llama, Qwen2, Qwen3).

Owns the module structure with fused `qkv_proj` and `gate_up_proj`, the
stacked loading of q/k/v and gate/up shards, and the architecture registry.
"""

from rvascend.models.registry import MODEL_ARCHITECTURES, model_class_for

__all__ = ["MODEL_ARCHITECTURES", "model_class_for"]

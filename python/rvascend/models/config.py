"""The subset of a Hugging Face `config.json` the supported families use."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from rvascend.models.families import FAMILIES, family_of


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """A Gated DeltaNet layer's dimensions (Qwen3.5's linear_* config keys)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        """Channels of the short causal conv: q, k and v of every head."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim


# Image-text checkpoints served as their text model (architecture, then the text model's):
# the vision tower's and the multi-token-prediction head's tensors are not loaded.
TEXT_OF_MULTIMODAL = {f.multimodal_architecture: f.architecture for f in FAMILIES if f.multimodal_architecture}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict[str, Any]]
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool        # bias on q/k/v (Qwen2: always)
    qk_norm: bool               # RMSNorm on q and k per head (Qwen3)
    eos_token_ids: tuple[int, ...]
    bos_token_id: Optional[int]
    # Per-frequency rope divisors (GGUF's rope_freqs tensor, Llama 3.1+ files).
    rope_freq_factors: Optional[tuple[float, ...]] = None
    # Hybrid models (Qwen3.5): "linear_attention" (Gated DeltaNet) or "full_attention" per layer.
    layer_types: Optional[tuple[str, ...]] = None
    linear_attention: Optional["LinearAttentionConfig"] = None
    partial_rotary_factor: float = 1.0  # RoPE on the first head_dim * factor dims of q and k
    # The checkpoint is an image-text model's (TEXT_OF_MULTIMODAL); its text model is served,
    # its weights named under model.language_model.
    multimodal_source: Optional[str] = None
    # Qwen3.5's multi-token-prediction layers (mtp_num_hidden_layers; models/qwen3_5_mtp.py).
    mtp_layers: int = 0

    @property
    def kv_layers(self) -> int:
        """Layers that keep K/V in the pool: the full-attention ones."""
        if self.layer_types is None:
            return self.num_hidden_layers
        return sum(t == "full_attention" for t in self.layer_types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        arch = archs[0]
        source = None
        if arch in TEXT_OF_MULTIMODAL:
            source, raw = arch, _text_config(arch, raw)
            arch = TEXT_OF_MULTIMODAL[source]
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "vocab_size") if k not in raw]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        heads = int(raw["num_attention_heads"])
        # transformers >= 5 keeps rope settings in rope_parameters; older files
        # have rope_theta and rope_scaling at the top level.
        rope = raw.get("rope_parameters") or {}
        theta = float(raw.get("rope_theta", rope.get("rope_theta", 10000.0)))
        scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) not in ("llama3", "default"):
            raise ValueError(f"unsupported rope scaling {scaling.get('rope_type', scaling.get('type'))!r}")
        family = family_of(arch)
        hybrid = _hybrid_fields(arch, raw, rope) if family.hybrid else {}
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            architecture=arch,
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3" else None,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=family.attention_bias or bool(raw.get("attention_bias", False)),
            qk_norm=family.qk_norm,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            rope_freq_factors=tuple(raw["rope_freq_factors"]) if raw.get("rope_freq_factors") else None,
            multimodal_source=source,
            **hybrid,
        )

    @classmethod
    def from_dir(cls, model_path: str) -> "ModelConfig":
        if not os.path.exists(model_path):
            raise FileNotFoundError(f"the model path {model_path} does not exist")
        if os.path.isfile(model_path):
            raise ValueError(f"{model_path} is a file but not a GGUF file (no 'GGUF' magic): a model path is a "
                             "Hugging Face checkpoint directory or a .gguf file")
        path = os.path.join(model_path, "config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{model_path} has no config.json: not a Hugging Face checkpoint directory")
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        gen = os.path.join(model_path, "generation_config.json")
        if os.path.exists(gen) and "eos_token_id" not in raw:
            with open(gen, encoding="utf-8") as f:
                raw["eos_token_id"] = json.load(f).get("eos_token_id")
        return cls.from_dict(raw)


def _text_config(arch: str, raw: dict[str, Any]) -> dict[str, Any]:
    """An image-text config's text model config: its text_config, with the top level's
    word-embedding tie and end-of-sequence ids where the text_config leaves them out."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"config.json of {arch} has no text_config object")
    merged = {k: raw[k] for k in ("tie_word_embeddings", "eos_token_id", "bos_token_id") if k in raw}
    merged.update(text)
    if "tie_word_embeddings" in raw:  # the top level's applies to the whole model's lm_head
        merged["tie_word_embeddings"] = raw["tie_word_embeddings"]
    merged["architectures"] = [TEXT_OF_MULTIMODAL[arch]]
    return merged


def _hybrid_fields(arch: str, raw: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's layer pattern, Gated DeltaNet dimensions and partial RoPE."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    unknown = sorted(set(types) - {"full_attention", "linear_attention"})
    if unknown or len(types) != layers:
        raise ValueError(f"layer_types must name {layers} layers as full_attention or linear_attention, got {types}")
    missing = [k for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                           "linear_value_head_dim", "linear_conv_kernel_dim") if k not in raw]
    if missing:
        raise ValueError(f"config.json of {arch} lacks {', '.join(missing)}")
    linear = LinearAttentionConfig(int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"]),
                                   int(raw["linear_key_head_dim"]), int(raw["linear_value_head_dim"]),
                                   int(raw["linear_conv_kernel_dim"]))
    dims = {"linear_num_key_heads": linear.num_key_heads, "linear_num_value_heads": linear.num_value_heads,
            "linear_key_head_dim": linear.key_head_dim, "linear_value_head_dim": linear.value_head_dim}
    for name, value in dims.items():
        if not 1 <= value <= 4096:
            raise ValueError(f"{name} = {value} is not in [1, 4096]")
    if linear.num_value_heads % linear.num_key_heads:
        raise ValueError(f"linear_num_value_heads = {linear.num_value_heads} is not a multiple of "
                         f"linear_num_key_heads = {linear.num_key_heads}")
    if "full_attention" not in types:
        raise ValueError(f"layer_types has no full_attention layer ({layers} linear_attention): this engine "
                         "serves hybrid models with at least one")
    if not 2 <= linear.conv_kernel <= 64:
        # The short convolution keeps conv_kernel - 1 past inputs: a kernel of 1 keeps none.
        raise ValueError(f"linear_conv_kernel_dim = {linear.conv_kernel} is not in [2, 64]")
    factor = float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {factor}")
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
    rotary = head_dim * factor
    if rotary != int(rotary) or int(rotary) % 2:
        raise ValueError(f"partial_rotary_factor {factor} of head_dim {head_dim} gives {rotary} rotary dims, not an "
                         "even whole number")
    mtp = int(raw.get("mtp_num_hidden_layers", 0))
    if not 0 <= mtp <= 16:
        raise ValueError(f"mtp_num_hidden_layers = {mtp} is not in [0, 16]")
    return {"layer_types": tuple(types), "linear_attention": linear, "partial_rotary_factor": factor,
            "mtp_layers": mtp}

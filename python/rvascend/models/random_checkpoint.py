"""Writes a random-weight checkpoint with a real model's shapes (for benchmarks).

  python -m rvascend.models.random_checkpoint --shape=qwen3-0.6b --output=DIR

The tokenizer is the random-weight test model's (2048 entries); benchmarks send
token ids, so the model's full vocabulary is still exercised.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from absl import app, flags, logging
from safetensors.torch import save_file

from rvascend.runtime import model_cache
from rvascend.models.random_model import ensure_random_model, random_weights

SHAPES = {
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1},
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1},
    # TinyLlama-1.1B: the model of llama.cpp's public BPI-F3 tables (the board model's calibration).
    "tinyllama-1.1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
        "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1},
    # Qwen2.5-0.5B: llama.cpp's public K1 table of #15288 (4 threads).
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1},
    # The served default's shapes (SmolLM2-135M-Instruct).
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1},
    # Qwen3.5-0.8B's text model: 24 layers (every fourth full attention, so 6 keep K/V), hidden 1024,
    # 8 heads / 2 KV heads of 256 with RoPE on a quarter of each, Gated DeltaNet 16 x 128 heads, one
    # MTP layer (mtp.*, read only by NEXTN).
    "qwen3.5-0.8b": {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 1024,
        "intermediate_size": 3584, "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)],
        "vocab_size": 248320, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10]},
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1, "mtp_num_hidden_layers": 1},
    "deepseek-r1-distill-qwen-1.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
        "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1},
}

# Qwen3.5-2B's text model, as the GGUF metadata of its conversion (unsloth/Qwen3.5-2B-GGUF,
# revision f6d5376b) gives it to llama.cpp: Qwen3.5-0.8B's (24 layers of the same pattern, 8
# heads / 2 KV heads of 256, Gated DeltaNet 16 key and 16 value heads of 128, tied embedding:
# 1.88 B parameters) with hidden 2048 and feed-forward 6144. The shape of the K1's published IME
# figure for Qwen3.5-2B Q4_1 (SpacemiT's llama.cpp build document). Without an MTP head: the
# metadata does not give one.
SHAPES["qwen3.5-2b"] = {**{k: v for k, v in SHAPES["qwen3.5-0.8b"].items() if k != "mtp_num_hidden_layers"},
                        "hidden_size": 2048, "intermediate_size": 6144}

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program: benchmarks import write() and have flags of their own.
    flags.DEFINE_enum("shape", "qwen3-0.6b", sorted(SHAPES), "Which model's shapes.")
    flags.DEFINE_string("output", None, "Directory to write.")
    flags.DEFINE_integer("seed", 0, "Weights seed.")
    flags.DEFINE_integer("layers", None, "Override the shape's number of layers.")


def write(shape: str, output: str, seed: int = 0, layers: int | None = None) -> str:
    """A checkpoint of `shape` with random weights; `layers` overrides its depth."""
    os.makedirs(output, exist_ok=True)
    config = dict(SHAPES[shape], torch_dtype="bfloat16")
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "layer_types" in config:  # the pattern's first `layers` entries
            config["layer_types"] = [config["layer_types"][i % len(config["layer_types"])] for i in range(layers)]
    with open(os.path.join(output, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    default = ensure_random_model()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(default, name), os.path.join(output, name))
    save_file(random_weights(config, seed), os.path.join(output, "model.safetensors"))
    return output


# What a benchmark's --shape may name: the random-weight test model, or a real model's shapes.
CHOICES = ["test", *sorted(SHAPES)]


def ensure(shape: str) -> str:
    """The cached random-weight checkpoint of `shape` in CHOICES (written on first use)."""
    if shape == "test":
        return ensure_random_model()
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {CHOICES}")
    return model_cache.ensure_checkpoint(f"rvascend-random-{shape}-v1", lambda d: write(shape, d),
                                         f"the random-weight {shape}-shaped checkpoint")


def main(argv: list[str]) -> int:
    del argv
    if not FLAGS.output:
        logging.error("--output is required")
        return 2
    logging.info("wrote %s", write(FLAGS.shape, FLAGS.output, FLAGS.seed, FLAGS.layers))
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

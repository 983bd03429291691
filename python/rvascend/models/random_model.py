"""The random-weight test model: a Llama-architecture checkpoint with random
weights and a real byte-level BPE tokenizer, generated deterministically at
first use and cached. Tests and benchmarks that need shapes, not answers, use it.

Shapes are chosen so the RVV policy's gate applies (every projection has
N, K >= 1024) while the whole model stays small (about 80 MB) and starts in
seconds. (The served default is a real model: default_model.py.)
"""

from __future__ import annotations

import json
import os
import pydoc

import torch
from safetensors.torch import save_file

from rvascend.models.families import family_of
from rvascend.runtime import model_cache

VERSION = 2
NAME = "rvascend-random-llama"

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

# Training text for the tokenizer: documentation that ships with every CPython,
# so the result is the same on every machine with the same Python.
_CORPUS_MODULES = ["builtins", "collections", "itertools", "functools", "json", "re", "string",
                   "textwrap", "pathlib", "argparse", "dataclasses", "typing", "unittest", "logging"]


def ensure_random_model() -> str:
    """The random model's directory, generated on first use."""
    return model_cache.ensure_checkpoint(f"{NAME}-v{VERSION}", write_random_model, "the random-weight model")


def _corpus() -> list[str]:
    texts = []
    for name in _CORPUS_MODULES:
        obj = pydoc.locate(name)
        texts.append(pydoc.plaintext.document(obj) if obj is not None else "")
    return texts


def write_tokenizer(path: str, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "chat_template": CHAT_TEMPLATE, "model_max_length": CONFIG["max_position_embeddings"]}, f, indent=2)


def write_random_model(path: str) -> None:
    write_tokenizer(path, CONFIG["vocab_size"])
    config = dict(CONFIG)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": [1, 4]}, f, indent=2)
    save_file(random_weights(config, seed=0), os.path.join(path, "model.safetensors"))


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (Hugging Face names) with N(0, 0.02) weights and unit norms."""
    g = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    family = family_of(config.get("architectures", [""])[0])
    hybrid = family.hybrid
    # Qwen3.5's norms scale by (1 + w): its identity is w = 0.
    unit = (torch.zeros if hybrid else torch.ones)(h, dtype=torch.bfloat16)
    tensors = {"model.embed_tokens.weight": normal(v, h), "model.norm.weight": unit.clone()}

    def layer_tensors(p: str, full_attention: bool) -> dict[str, torch.Tensor]:
        out = {p + "mlp.gate_proj.weight": normal(i, h), p + "mlp.up_proj.weight": normal(i, h),
               p + "mlp.down_proj.weight": normal(h, i),
               p + "input_layernorm.weight": unit.clone(), p + "post_attention_layernorm.weight": unit.clone()}
        if not full_attention:
            return {**out, **_deltanet_weights(config, p + "linear_attn.", normal)}
        out.update({
            p + "self_attn.q_proj.weight": normal(2 * q if hybrid else q, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.o_proj.weight": normal(h, q),
        })
        if hybrid:
            out[p + "self_attn.q_norm.weight"] = torch.zeros(d, dtype=torch.bfloat16)
            out[p + "self_attn.k_norm.weight"] = torch.zeros(d, dtype=torch.bfloat16)
        if family.attention_bias:
            for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                out[p + f"self_attn.{name}.bias"] = normal(rows)
        if family.qk_norm and not hybrid:
            out[p + "self_attn.q_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
            out[p + "self_attn.k_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        return out

    for layer in range(config["num_hidden_layers"]):
        tensors.update(layer_tensors(f"model.layers.{layer}.",
                                     not hybrid or config["layer_types"][layer] == "full_attention"))
    if not config.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = normal(v, h)
    if hybrid and config.get("mtp_num_hidden_layers"):  # the MTP head: one full-attention layer
        tensors.update(layer_tensors("mtp.layers.0.", True))
        tensors.update({"mtp.fc.weight": normal(h, 2 * h), "mtp.pre_fc_norm_embedding.weight": unit.clone(),
                        "mtp.pre_fc_norm_hidden.weight": unit.clone(), "mtp.norm.weight": unit.clone()})
    return tensors


def _deltanet_weights(config: dict, p: str, normal) -> dict[str, torch.Tensor]:
    """A Gated DeltaNet layer's tensors: decays spread over (0.5, 1) per token, unit gated norm."""
    h = config["hidden_size"]
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key, value = nk * config["linear_key_head_dim"], nv * config["linear_value_head_dim"]
    conv = 2 * key + value
    return {p + "in_proj_qkv.weight": normal(conv, h), p + "in_proj_z.weight": normal(value, h),
            p + "in_proj_b.weight": normal(nv, h), p + "in_proj_a.weight": normal(nv, h),
            p + "conv1d.weight": (normal(conv, 1, config["linear_conv_kernel_dim"]) * 10),
            p + "dt_bias": torch.zeros(nv, dtype=torch.bfloat16),
            p + "A_log": torch.linspace(-2.0, 0.0, nv).to(torch.bfloat16),
            p + "norm.weight": torch.ones(config["linear_value_head_dim"], dtype=torch.bfloat16),
            p + "out_proj.weight": normal(h, value)}

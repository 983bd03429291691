"""Writes a Hugging Face checkpoint directory as the GGUF file llama.cpp's converter
would write: the metadata under llama.cpp's keys, the byte-level BPE tokenizer as
`tokenizer.ggml.*`, Llama's Q/K rows reordered for llama.cpp's rotary, and each
tensor in the type asked for (`gguf.quants.quantize`). It is how this project gives
llama.cpp the same weights it serves itself (bench/llama_cpp_peer.py), and how the GGUF
tests make files of every family.

  python -m rvascend.models.gguf_export --checkpoint=DIR --output=model.gguf [--type=BF16]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Optional

import numpy as np
import torch
from safetensors import safe_open

from rvascend.models import gguf_checkpoint, gguf_tokenizer
from rvascend.models.config import ModelConfig
from rvascend.models.families import family_of
from rvascend.models.layers import RotaryEmbedding
from rvascend.models.loader import weight_files

# Hugging Face name (layer index as {}) -> GGUF name.
_TO_GGUF = {hf: g for g, hf in gguf_checkpoint.GLOBAL_NAMES.items()}
_TO_GGUF.update({f"model.layers.{{}}.{hf}": f"blk.{{}}.{g}" for g, hf in gguf_checkpoint.LAYER_NAMES.items()})
_UNUSED = 5  # llama.cpp's token type of padding entries


def gguf_name(hf: str) -> str:
    parts = hf.split(".")
    if len(parts) > 3 and parts[1] == "layers":
        return _TO_GGUF[".".join(parts[:2] + ["{}"] + parts[3:])].format(parts[2])
    return _TO_GGUF[hf]


def permute_for_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """Each head's rows as interleaved rotary pairs (llama.cpp's order for Llama's Q and K)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _pre_tokenizer_type(spec: dict[str, Any]) -> str:
    """llama.cpp's name for how tokenizer.json splits text before BPE."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits: list[Optional[str]] = []
    for step in steps:
        if step.get("type") == "Split" and step.get("behavior") == "Isolated":
            splits.append(step["pattern"].get("Regex"))
        elif step.get("type") == "Digits" and step.get("individual_digits"):
            splits.append(r"\p{N}")
        elif step.get("type") == "ByteLevel":
            if step.get("use_regex", True):
                splits.append(None)
        else:
            raise ValueError(f"pre-tokenizer step {step.get('type')!r} has no llama.cpp equivalent here")
    for name, known in gguf_tokenizer.PRE_TOKENIZER_SPLITS.items():
        if tuple(splits) == known:
            return name
    raise ValueError(f"tokenizer.json's text split {splits} matches no llama.cpp pre-tokenizer type known here")


def _add_tokenizer(writer, checkpoint_dir: str, vocab_size: int) -> None:
    with open(os.path.join(checkpoint_dir, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"only byte-level BPE tokenizers can be exported (this one is {model.get('type')!r})")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [_UNUSED] * vocab_size
    for token, i in model["vocab"].items():
        tokens[i], types[i] = token, 1
    for added in spec.get("added_tokens") or []:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = 3 if added.get("special") else 4
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer_type(spec))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])])
    config: dict[str, Any] = {}
    config_path = os.path.join(checkpoint_dir, "tokenizer_config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("pad_token", writer.add_pad_token_id)):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            add(ids[token])
    post = spec.get("post_processor") or {}
    writer.add_add_bos_token(post.get("type") == "TemplateProcessing"
                             and "SpecialToken" in (post.get("single") or [{}])[0])
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])


def export(checkpoint_dir: str, output: str, types: Optional[dict[str, Any]] = None,
           default_type: Optional[Any] = None) -> None:
    """Writes `output`; `types` maps a tensor role ("attn_q", "ffn_down", "token_embd",
    ...) to a GGML type; other matrices get `default_type` (BF16), vectors F32."""
    import gguf

    Q = gguf.GGMLQuantizationType
    default_type = Q.BF16 if default_type is None else default_type
    with open(os.path.join(checkpoint_dir, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    config = ModelConfig.from_dict(raw)
    family = family_of(config.architecture)
    w = gguf.GGUFWriter(output, family.gguf_architecture)
    for add, value in ((w.add_block_count, config.num_hidden_layers),
                       (w.add_context_length, config.max_position_embeddings),
                       (w.add_embedding_length, config.hidden_size),
                       (w.add_feed_forward_length, config.intermediate_size),
                       (w.add_head_count, config.num_attention_heads),
                       (w.add_head_count_kv, config.num_key_value_heads),
                       (w.add_rope_freq_base, config.rope_theta), (w.add_layer_norm_rms_eps, config.rms_norm_eps),
                       (w.add_rope_dimension_count, config.head_dim), (w.add_key_length, config.head_dim),
                       (w.add_value_length, config.head_dim), (w.add_vocab_size, config.vocab_size)):
        add(value)
    _add_tokenizer(w, checkpoint_dir, config.vocab_size)
    if config.rope_scaling is not None:
        # llama.cpp carries Llama 3's rope scaling as per-frequency divisors.
        plain = RotaryEmbedding(dataclasses.replace(config, rope_scaling=None)).inv_freq
        scaled = RotaryEmbedding(config).inv_freq
        w.add_tensor("rope_freqs.weight", (plain / scaled).numpy().astype(np.float32))
    for path in weight_files(checkpoint_dir):
        with safe_open(path, framework="pt") as f:
            for hf in f.keys():
                if hf.endswith("rotary_emb.inv_freq") or (hf == "lm_head.weight" and config.tie_word_embeddings):
                    continue
                name = gguf_name(hf)
                array = f.get_tensor(hf).to(torch.float32).numpy()
                if family.gguf_rotary_rows_permuted and name.endswith(("attn_q.weight", "attn_q.bias")):
                    array = permute_for_llama_cpp(array, config.num_attention_heads)
                elif family.gguf_rotary_rows_permuted and name.endswith(("attn_k.weight", "attn_k.bias")):
                    array = permute_for_llama_cpp(array, config.num_key_value_heads)
                qtype = (types or {}).get(name.split(".")[-2], default_type) if array.ndim == 2 else Q.F32
                if qtype == Q.F32:
                    w.add_tensor(name, np.ascontiguousarray(array))
                else:
                    w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


def main(argv: list[str]) -> int:
    del argv
    import gguf
    from absl import flags, logging

    export(flags.FLAGS.checkpoint, flags.FLAGS.output,
           default_type=gguf.GGMLQuantizationType[flags.FLAGS.type])
    logging.info("wrote %s", flags.FLAGS.output)
    return 0


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("checkpoint", None, "Hugging Face checkpoint directory.", required=True)
    flags.DEFINE_string("output", None, "GGUF file to write.", required=True)
    flags.DEFINE_enum("type", "BF16", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"],
                      "Tensor type of the matrices (vectors stay F32).")
    sys.exit(app.run(main))

"""A GGUF file (llama.cpp's format) as a checkpoint: the config from its metadata,
its tensors under Hugging Face names dequantized by the `gguf` package, and its
tokenizer (gguf_tokenizer.py). `load_model` and `Tokenizer` take a `.gguf` path
directly; `convert` writes the equivalent Hugging Face directory once, for machines
without the `gguf` package (a board) and for fast starts.

Supported: the Llama, Qwen2 and Qwen3 architectures; every tensor type the `gguf`
package can dequantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants,
...). llama.cpp's converter reorders the rows of Llama's Q and K projections for its
interleaved rotary; that order is undone here (Qwen files are not reordered).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Optional

import numpy as np
import torch

from rvascend.models import gguf_tokenizer

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor name -> Hugging Face name ({} is the layer index).
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")
_ROPE_FREQS = "rope_freqs.weight"


class GgufError(ValueError):
    """The file is not a GGUF this engine can serve; the message says why."""


def is_gguf(path: str) -> bool:
    """A regular file starting with the GGUF magic."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _gguf_module():
    try:
        import gguf
    except ImportError:
        raise GgufError("reading a GGUF file needs the `gguf` package (llama.cpp's Python library): "
                        "pip install gguf, or convert the file once on a machine that has it "
                        "(python -m rvascend.models.gguf_checkpoint --gguf=F --output=DIR)") from None
    return gguf


class GgufCheckpoint:
    """One GGUF file, opened (memory-mapped) and validated."""

    def __init__(self, path: str) -> None:
        if not is_gguf(path):
            raise GgufError(f"{path} is not a GGUF file (no 'GGUF' magic at its start)")
        gguf = _gguf_module()
        self.path = path
        try:
            self._reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # the reader raises whatever numpy raised on a short or corrupt file
            raise GgufError(f"{path}: cannot read the GGUF structure (truncated or corrupt file?): "
                            f"{type(e).__name__}: {e}") from None
        size = os.path.getsize(path)
        for t in self._reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise GgufError(f"{path} is truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes}, "
                                f"the file has {size}")
        self.meta: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            try:
                self.meta[key] = field.contents()
            except Exception as e:
                raise GgufError(f"{path}: metadata {key!r} is unreadable: {e}") from None
        arch = self.meta.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise GgufError(f"{path}: architecture {arch!r} is not supported; supported: "
                            f"{', '.join(sorted(ARCHITECTURES))}")
        self.arch: str = arch
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.config = self._config()

    # -- metadata ---------------------------------------------------------------------
    def _key(self, name: str, default: Any = None, required: bool = False) -> Any:
        value = self.meta.get(f"{self.arch}.{name}", default)
        if value is None and required:
            raise GgufError(f"{self.path}: metadata {self.arch}.{name} is missing")
        return value

    def _config(self) -> dict[str, Any]:
        """A Hugging Face config.json for the file."""
        if "token_embd.weight" not in self._tensors:
            raise GgufError(f"{self.path} has no token_embd.weight")
        hidden = int(self._key("embedding_length", required=True))
        heads = int(self._key("attention.head_count", required=True))
        head_dim = int(self._key("attention.key_length") or hidden // heads)
        rope_dim = int(self._key("rope.dimension_count") or head_dim)
        if rope_dim != head_dim:
            raise GgufError(f"{self.path}: partial rotary ({rope_dim} of {head_dim} dims) is not supported")
        scaling = self._key("rope.scaling.type")
        if scaling not in (None, "none"):
            raise GgufError(f"{self.path}: rope scaling {scaling!r} is not supported")
        vocab_rows = int(self._tensors["token_embd.weight"].shape[-1])
        config: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.arch]],
            "model_type": self.arch,
            "hidden_size": hidden,
            "intermediate_size": int(self._key("feed_forward_length", required=True)),
            "num_hidden_layers": int(self._key("block_count", required=True)),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._key("attention.head_count_kv") or heads),
            "head_dim": head_dim,
            "vocab_size": vocab_rows,
            "rms_norm_eps": float(self._key("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._key("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._key("context_length", 4096)),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "eos_token_id": gguf_tokenizer.end_of_generation_ids(self.meta),
            "bos_token_id": self.meta.get("tokenizer.ggml.bos_token_id"),
            "attention_bias": "blk.0.attn_q.bias" in self._tensors,
            "torch_dtype": "bfloat16",
        }
        if _ROPE_FREQS in self._tensors:
            # Llama 3.1+ files carry the per-frequency rope scaling factors as a tensor.
            config["rope_freq_factors"] = [float(v) for v in self._dequantize(_ROPE_FREQS).reshape(-1)]
        return config

    def tokenizer_files(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tokenizer_json, tokenizer_config = gguf_tokenizer.tokenizer_files(self.meta)
        tokenizer_config["model_max_length"] = self.config["max_position_embeddings"]
        return tokenizer_json, tokenizer_config

    # -- tensors ----------------------------------------------------------------------
    def _dequantize(self, name: str) -> np.ndarray:
        gguf = _gguf_module()
        t = self._tensors[name]
        try:
            return gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise GgufError(f"{self.path}: tensor {name} has type {t.tensor_type.name}, which the gguf package "
                            "cannot dequantize") from None

    def hf_name(self, name: str) -> Optional[str]:
        """The Hugging Face name of a GGUF tensor (None for rope_freqs, folded into the config)."""
        if name == _ROPE_FREQS:
            return None
        if name in GLOBAL_NAMES:
            return GLOBAL_NAMES[name]
        m = _LAYER_TENSOR.match(name)
        if m and m.group(2) in LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
        raise GgufError(f"{self.path}: tensor {name!r} has no place in a {self.arch} model")

    def tensors(self, dtype: torch.dtype = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, tensor in `dtype`) for every weight, in file order."""
        heads, kv_heads = self.config["num_attention_heads"], self.config["num_key_value_heads"]
        for name in self._tensors:
            hf = self.hf_name(name)
            if hf is None:
                continue
            array = np.ascontiguousarray(self._dequantize(name), dtype=np.float32)
            if not array.flags.writeable:  # F32 tensors come back as views of the read-only map
                array = array.copy()
            values = torch.from_numpy(array)
            if self.arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
                values = _unpermute_rotary_rows(values, heads)
            elif self.arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
                values = _unpermute_rotary_rows(values, kv_heads)
            yield hf, values.to(dtype)


def _unpermute_rotary_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp stores each head's rows as interleaved (x0, x_half, x1, x_half+1, ...)
    pairs; Hugging Face's rotate-half wants the two halves one after the other."""
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def convert(gguf_path: str, output_dir: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """Writes the Hugging Face checkpoint directory equivalent to a GGUF file:
    config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json."""
    from safetensors.torch import save_file

    ckpt = GgufCheckpoint(gguf_path)
    os.makedirs(output_dir, exist_ok=True)
    config = dict(ckpt.config, torch_dtype=str(dtype).removeprefix("torch."))
    tokenizer_json, tokenizer_config = ckpt.tokenizer_files()
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": tokenizer_config,
    }
    for name, content in files.items():
        with open(os.path.join(output_dir, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=1, ensure_ascii=False)
    save_file(dict(ckpt.tensors(dtype)), os.path.join(output_dir, "model.safetensors"),
              metadata={"format": "pt", "source": os.path.basename(gguf_path)})


def main(argv: list[str]) -> None:
    del argv
    from absl import flags, logging

    convert(flags.FLAGS.gguf, flags.FLAGS.output)
    logging.info("wrote %s", flags.FLAGS.output)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("gguf", None, "The GGUF file to convert.", required=True)
    flags.DEFINE_string("output", None, "The Hugging Face checkpoint directory to write.", required=True)
    app.run(main)

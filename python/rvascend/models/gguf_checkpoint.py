"""A GGUF file (llama.cpp's format) as a checkpoint: the config from its metadata,
its tensors under Hugging Face names dequantized by the `gguf` package, and its
tokenizer (gguf_tokenizer.py). `load_model` and `Tokenizer` take a `.gguf` path
directly; `convert` writes the equivalent Hugging Face directory once, for machines
without the `gguf` package (a board) and for fast starts.

Supported: the Llama, Qwen2, Qwen3 and Qwen3.5 (gguf_qwen35.py) architectures; every tensor type the `gguf`
package can dequantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants,
...). llama.cpp's converter reorders the rows of Llama's Q and K projections for its
interleaved rotary; that order is undone here (Qwen files are not reordered).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from typing import Any, Iterator, Optional

import numpy as np
import torch

from rvascend.models import gguf_file, gguf_qwen35, gguf_tokenizer
from rvascend.models.families import FAMILIES, family_of_gguf

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
        raise GgufError("dequantizing this GGUF tensor type needs the `gguf` package (llama.cpp's Python library): "
                        "pip install gguf, or convert the file once on a machine that has it "
                        "(python -m rvascend.models.gguf_checkpoint --gguf=F --output=DIR)") from None
    return gguf


class GgufCheckpoint:
    """One GGUF file, its header read and checked by gguf_file.py, its config validated
    against its tensors before any weight is read."""

    def __init__(self, path: str) -> None:
        if not is_gguf(path):
            raise GgufError(f"{path} is not a GGUF file (no 'GGUF' magic at its start)")
        self.path = path
        try:
            self._file = gguf_file.GgufFile(path)
        except gguf_file.GgufFormatError as e:
            raise GgufError(str(e)) from None
        self.meta: dict[str, Any] = self._file.metadata
        try:
            arch = gguf_file.typed(self.meta, "general.architecture", "string", source=path)
        except gguf_file.GgufFormatError as e:
            self._file.close()
            raise GgufError(str(e)) from None
        family = family_of_gguf(arch)
        if family is None:
            raise GgufError(f"{path}: architecture {arch!r} is not supported; supported: "
                            f"{', '.join(sorted(f.gguf_architecture for f in FAMILIES))}")
        self.arch: str = arch
        self.family = family
        self._tensors = self._file.tensors
        self.config = self._config()
        self._check_tensors()

    # -- metadata ---------------------------------------------------------------------
    def _key(self, name: str, default: Any = None, required: bool = False) -> Any:
        value = self.meta.get(f"{self.arch}.{name}", default)
        if value is None and required:
            raise GgufError(f"{self.path}: metadata {self.arch}.{name} is missing")
        return value

    def _typed(self, name: str, kind: str, default: Any = None) -> Any:
        """This architecture's metadata `name`, checked to be a `kind` (gguf_file.typed)."""
        try:
            return gguf_file.typed(self.meta, f"{self.arch}.{name}", kind, default, self.path)
        except gguf_file.GgufFormatError as e:
            raise GgufError(str(e)) from None

    def _int(self, name: str, default: Optional[int] = None, low: int = 1, high: int = 1 << 24) -> int:
        value = self._key(name, default, required=default is None)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise GgufError(f"{self.path}: metadata {self.arch}.{name} = {value!r} is not an integer in "
                            f"[{low}, {high}]")
        return value

    def error(self, message: str) -> GgufError:
        """A metadata error of this file (message starts with the key after the architecture)."""
        return GgufError(f"{self.path}: metadata {self.arch}.{message}")

    def _float(self, name: str, default: float) -> float:
        value = self._key(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise GgufError(f"{self.path}: metadata {self.arch}.{name} = {value!r} is not a positive number")
        return float(value)

    def _config(self) -> dict[str, Any]:
        """A Hugging Face config.json for the file."""
        if "token_embd.weight" not in self._tensors:
            raise GgufError(f"{self.path} has no token_embd.weight")
        embed = self._tensors["token_embd.weight"]
        if len(embed.dims) != 2:
            raise GgufError(f"{self.path}: token_embd.weight has {len(embed.dims)} dimensions, not 2")
        hidden = self._int("embedding_length")
        if embed.dims[0] != hidden:
            raise GgufError(f"{self.path}: {self.arch}.embedding_length = {hidden} but token_embd.weight has rows "
                            f"of {embed.dims[0]}")
        heads = self._int("attention.head_count", high=4096)
        kv_heads = self._int("attention.head_count_kv", heads, high=heads)
        if heads % kv_heads:
            raise GgufError(f"{self.path}: {heads} attention heads do not split into {kv_heads} KV head groups")
        head_dim = self._int("attention.key_length", hidden // heads or 1, high=4096)
        if head_dim % 2:
            raise GgufError(f"{self.path}: head dimension {head_dim} is odd (rotary needs pairs)")
        if self._int("attention.value_length", head_dim, high=4096) != head_dim:
            raise GgufError(f"{self.path}: attention.value_length differs from attention.key_length (not supported)")
        rope_dim = self._int("rope.dimension_count", head_dim, high=4096)
        if rope_dim != head_dim and not self.family.hybrid:  # Qwen3.5's partial rotary: gguf_qwen35.py
            raise GgufError(f"{self.path}: partial rotary ({rope_dim} of {head_dim} dims) is not supported")
        scaling = self._typed("rope.scaling.type", "string")
        if scaling not in (None, "none"):
            raise GgufError(f"{self.path}: rope scaling {scaling!r} is not supported")
        layers = self._int("block_count", high=4096)
        present = {int(m.group(1)) for m in map(_LAYER_TENSOR.match, self._tensors) if m}
        beyond = sorted(i for i in present if i >= layers)
        if beyond:
            raise GgufError(f"{self.path}: {self.arch}.block_count = {layers} but the file has tensors of "
                            f"layer {beyond[0]} (blk.{beyond[0]}.*)")
        # Checked before any module is built: a block_count the tensors do not back
        # would otherwise cost the construction of up to 4096 layers before failing.
        absent = sorted(set(range(layers)) - present)
        if absent:
            raise GgufError(f"{self.path}: {self.arch}.block_count = {layers} but the file has no tensors of "
                            f"layer {absent[0]} (blk.{absent[0]}.*)")
        config: dict[str, Any] = {
            "architectures": [self.family.architecture],
            "model_type": self.arch,
            "hidden_size": hidden,
            "intermediate_size": self._int("feed_forward_length"),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "vocab_size": int(embed.dims[1]),
            "rms_norm_eps": self._float("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": self._float("rope.freq_base", 10000.0),
            "max_position_embeddings": self._int("context_length", 4096, high=1 << 22),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "eos_token_id": gguf_tokenizer.end_of_generation_ids(self.meta),
            "bos_token_id": gguf_file.typed(self.meta, "tokenizer.ggml.bos_token_id", "integer", source=self.path),
            "attention_bias": "blk.0.attn_q.bias" in self._tensors,
            "torch_dtype": "bfloat16",
        }
        if self.family.hybrid:
            config.update(gguf_qwen35.config_fields(self, layers, head_dim))
        if _ROPE_FREQS in self._tensors:
            # Llama 3.1+ files carry the per-frequency rope scaling factors as a tensor.
            factors = self._dequantize(_ROPE_FREQS).reshape(-1)
            if factors.shape[0] != head_dim // 2 or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
                raise GgufError(f"{self.path}: rope_freqs.weight must hold {head_dim // 2} positive factors")
            config["rope_freq_factors"] = [float(v) for v in factors]
        return config

    def _expected_shape(self, name: str) -> Optional[tuple[int, ...]]:
        """The shape (rows first) the config implies for a tensor, or None for any."""
        c = self.config
        hidden, ff, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        shapes = {
            "output.weight": (c["vocab_size"], hidden), "output_norm.weight": (hidden,),
            "attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,),
            "attn_q.weight": (q, hidden), "attn_q.bias": (q,), "attn_k.weight": (kv, hidden), "attn_k.bias": (kv,),
            "attn_v.weight": (kv, hidden), "attn_v.bias": (kv,), "attn_output.weight": (hidden, q),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
            "ffn_gate.weight": (ff, hidden), "ffn_up.weight": (ff, hidden), "ffn_down.weight": (hidden, ff),
        }
        m = _LAYER_TENSOR.match(name)
        if self.family.hybrid:
            return gguf_qwen35.expected_shape(c, m.group(2) if m else name, int(m.group(1)) if m else None)
        return shapes.get(m.group(2) if m else name)

    def _check_tensors(self) -> None:
        for name, t in self._tensors.items():
            self.hf_name(name)
            want = self._expected_shape(name)
            if want == ():
                m = _LAYER_TENSOR.match(name)
                raise GgufError(f"{self.path}: tensor {name} does not belong in layer {m.group(1)}, a "
                                f"{self.config['layer_types'][int(m.group(1))]} layer")
            if want is not None and t.shape != want:
                raise GgufError(f"{self.path}: tensor {name} has shape {list(t.shape)}, the config "
                                f"({self.arch}: hidden {self.config['hidden_size']}, heads "
                                f"{self.config['num_attention_heads']}/{self.config['num_key_value_heads']} x "
                                f"{self.config['head_dim']}, ffn {self.config['intermediate_size']}) implies "
                                f"{list(want)}")

    def tokenizer_files(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tokenizer_json, tokenizer_config = gguf_tokenizer.tokenizer_files(self.meta)
        tokenizer_config["model_max_length"] = self.config["max_position_embeddings"]
        return tokenizer_json, tokenizer_config

    # -- tensors ----------------------------------------------------------------------
    def _dequantize(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """FP32 values of a tensor (of `rows` of it, the first dimension), rows first: a new,
        writable array (never a view of the read-only map)."""
        t = self._tensors[name]
        if t.type_name in ("I8", "I16", "I32", "I64"):
            raise GgufError(f"{self.path}: tensor {name} has type {t.type_name}, an integer type, not a weight's")
        plain = self._file.array(name)
        if plain is not None:
            return plain[rows].astype(np.float32)
        raw = self._file.raw(name)[rows]
        shape = (raw.shape[0], *t.shape[1:]) if len(t.shape) > 1 else t.shape
        if t.type_name == "BF16":
            return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        fmt = self.kept_format(name)
        if fmt is not None:  # the project's own dequantizer: no `gguf` package needed (a board)
            from rvascend.ops import quantized_linear

            try:
                return quantized_linear.dequantize_ggml(raw, fmt, shape[0], shape[1]).numpy()
            except ValueError as e:
                raise GgufError(f"{self.path}: tensor {name}: {e}") from None
        gguf = _gguf_module()
        try:
            return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.type_id)).reshape(shape)
        except (NotImplementedError, ValueError):
            raise GgufError(f"{self.path}: tensor {name} has type {t.type_name}, which the gguf package "
                            "cannot dequantize") from None

    def _converted(self, name: str, dtype: torch.dtype, view: bool = False) -> torch.Tensor:
        """A tensor in `dtype`, rows in file order. BF16 into BF16 is one copy of the
        bytes; anything else is converted a slab of rows at a time into the result, so
        no FP32 copy of a whole tensor exists (for Qwen3-0.6B's 152k x 1024 embedding the
        FP32 and uint32 temporaries were 1.2 GB beside its 0.3 GB result: the load's
        peak RSS was twice the model's)."""
        t = self._tensors[name]
        if t.type_name == "BF16" and dtype == torch.bfloat16:
            raw = self._file.raw(name)
            if view:  # the file's bytes themselves, read-only (tensors(view=True))
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                    return torch.from_numpy(raw.view(np.int16).reshape(t.shape)).view(torch.bfloat16)
            return torch.from_numpy(np.array(raw).view(np.int16).reshape(t.shape)).view(torch.bfloat16)
        if len(t.shape) < 2:
            return torch.from_numpy(np.ascontiguousarray(self._dequantize(name), dtype=np.float32)).to(dtype)
        out = torch.empty(t.shape, dtype=dtype)
        step = max(1, (16 << 20) // max(1, 4 * int(np.prod(t.shape[1:]))))  # 16 MiB of FP32 per slab
        for r0 in range(0, t.shape[0], step):
            rows = slice(r0, min(r0 + step, t.shape[0]))
            out[rows] = torch.from_numpy(np.ascontiguousarray(self._dequantize(name, rows), dtype=np.float32))
        return out

    def hf_name(self, name: str) -> Optional[str]:
        """The Hugging Face name of a GGUF tensor (None for rope_freqs, folded into the config)."""
        if name == _ROPE_FREQS:
            return None
        if name in GLOBAL_NAMES:
            return GLOBAL_NAMES[name]
        m = _LAYER_TENSOR.match(name)
        names = gguf_qwen35.LAYER_NAMES if self.family.hybrid else LAYER_NAMES
        if m and m.group(2) in names:
            return f"model.layers.{m.group(1)}.{names[m.group(2)]}"
        raise GgufError(f"{self.path}: tensor {name!r} has no place in a {self.arch} model")

    def tensors(self, dtype: torch.dtype = torch.bfloat16, skip: frozenset = frozenset(), view: bool = False
                ) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, tensor in `dtype`) for every weight not in `skip` (GGUF
        names), in file order. With `view`, a BF16 tensor asked for in BF16 is a read-only
        view of the mapped file: the caller copies it (releasing each slab it copied with
        release_view) before it asks for the next, and never writes to it."""
        for name in self._tensors:
            hf = self.hf_name(name)
            if hf is None or name in skip:
                continue
            m = _LAYER_TENSOR.match(name)
            leaf = m.group(2) if m else name
            if self.family.hybrid and gguf_qwen35.needs_fp32(leaf):
                try:
                    tensor = gguf_qwen35.to_hf(self.config, leaf, self._converted(name, torch.float32)).to(dtype)
                except ValueError as e:
                    raise GgufError(f"{self.path}: tensor {name}: {e}") from None
            else:
                tensor = self._in_hf_row_order(name, self._converted(name, dtype, view))
            if view:
                yield hf, tensor
                self.release(name)
            else:
                self.release(name)
                yield hf, tensor

    def kept_format(self, name: str) -> Optional[str]:
        """The quantized format a matrix stays in (its own type, when the native registry keeps
        it: ops/quantized_linear.FORMATS), or None."""
        from rvascend.ops.quantized_linear import BLOCK_K, GGML_TYPES

        t = self._tensors[name]
        fmt = GGML_TYPES.get(t.type_id) if len(t.dims) == 2 else None
        if fmt is not None and self.family.hybrid:
            m = _LAYER_TENSOR.match(name)
            if m and not gguf_qwen35.keeps_quantized(self.config, m.group(2), BLOCK_K[fmt]):
                return None
        return fmt

    def row_count(self, name: str) -> int:
        """A tensor's rows (its first dimension), without reading its blocks."""
        return int(self._tensors[name].shape[0])

    def quantized_rows(self, name: str) -> np.ndarray:
        """A kept tensor's GGML blocks as uint8 [rows, bytes per row], rows in Hugging Face
        order (a view of the file unless rows had to be reordered)."""
        rows = self._file.raw(name)
        m = _LAYER_TENSOR.match(name)
        if self.family.hybrid and m:
            return gguf_qwen35.quantized_in_hf_order(self.config, m.group(2), rows)
        return self._in_hf_row_order(name, rows)

    def _in_hf_row_order(self, name: str, rows):
        if self.family.gguf_rotary_rows_permuted and name.endswith(("attn_q.weight", "attn_q.bias")):
            return _unpermute_rotary_rows(rows, self.config["num_attention_heads"])
        if self.family.gguf_rotary_rows_permuted and name.endswith(("attn_k.weight", "attn_k.bias")):
            return _unpermute_rotary_rows(rows, self.config["num_key_value_heads"])
        return rows

    def type_names(self) -> dict[str, str]:
        """GGUF tensor name -> its GGML type's name, in file order."""
        return {name: t.type_name for name, t in self._tensors.items()}

    def dequantized_report(self, kept: frozenset, dtype: torch.dtype) -> list[str]:
        """One line per quantized GGML type whose tensors (those not in `kept`) load
        dequantized to `dtype`: how many, their bytes in the file and in memory."""
        by_type: dict[str, list[int]] = {}
        for name, t in self._tensors.items():
            if name in kept or t.type_name in ("F32", "F16", "BF16", "F64") or self.hf_name(name) is None:
                continue
            count_bytes = by_type.setdefault(t.type_name, [0, 0, 0])
            count_bytes[0] += 1
            count_bytes[1] += t.n_bytes
            count_bytes[2] += t.n_elements * dtype.itemsize
        return [f"{count} {type_name} tensor{'s' if count > 1 else ''} dequantized to "
                f"{str(dtype).removeprefix('torch.')}: {file_bytes / 2**20:.1f} MiB in the file, "
                f"{resident / 2**20:.1f} MiB in memory ({resident / max(1, file_bytes):.1f}x)"
                for type_name, (count, file_bytes, resident) in sorted(by_type.items())]

    def release(self, name: str) -> None:
        """Drops a tensor's pages from memory once it has been copied (gguf_file.py)."""
        self._file.release(name)

    def release_view(self, view: torch.Tensor) -> None:
        """Drops the pages under a contiguous view of the file (a slab of tensors(view=True)'s
        tensor, copied); anything else is left alone."""
        if view.is_contiguous():
            self._file.release_bytes(view.data_ptr(), view.numel() * view.element_size())

    def close(self, after_error: bool = False) -> None:
        """Unmaps the file (no view of it may be alive, unless `after_error`: gguf_file.py)."""
        self._file.close(after_error)


def _unpermute_rotary_rows(w, heads: int):
    """llama.cpp stores each head's rows as interleaved (x0, x_half, x1, x_half+1, ...)
    pairs; Hugging Face's rotate-half wants the two halves one after the other. Rows
    of a quantized tensor (numpy, whole blocks per row) move the same way."""
    rows = w.shape[0]
    half = rows // heads // 2
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
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

"""Qwen3.5 (dense text) GGUF files, architecture `qwen35`, as llama.cpp's converter
writes them: the names of their tensors, the config in their metadata, and the
changes the converter makes to the values, undone here so the tensors are the
Hugging Face checkpoint's again (models/qwen3_5.py loads those).

What the converter changes (llama.cpp `conversion/qwen.py`, read for the facts):
- zero-centred RMSNorm weights are stored as 1 + w (all norms but the Gated
  DeltaNet's output norm); they are read back in FP32 as w = stored - 1, exact
  for weights that came from BF16;
- `A_log` is stored as A = -exp(A_log); read back as log(-A) (within an ulp);
- the conv1d kernel is stored without its middle dimension of 1;
- where a layer has fewer key heads than value heads, every value-head axis
  (the V rows of the qkv projection, the z, a and b projections, A, dt_bias, the
  conv1d's V channels and the output projection's columns) is stored in tiled
  order (value head j of key group g at j * groups + g) instead of grouped by key
  head (g * per_group + j); the grouped order is restored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from rvascend.models.gguf_checkpoint import GgufCheckpoint

LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # gated attention (one layer in four)
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    # Gated DeltaNet
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight", "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}

# Stored as 1 + w.
_SHIFTED_NORMS = ("attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight",
                  "output_norm.weight")


def config_fields(ckpt: "GgufCheckpoint", layers: int, head_dim: int) -> dict[str, Any]:
    """The Hugging Face config keys of the hybrid layers, from the file's metadata."""
    kernel = ckpt._int("ssm.conv_kernel", high=64)
    key_head_dim = ckpt._int("ssm.state_size", high=4096)
    key_heads = ckpt._int("ssm.group_count", high=4096)
    value_heads = ckpt._int("ssm.time_step_rank", high=4096)
    inner = ckpt._int("ssm.inner_size")
    if inner % value_heads:
        raise ckpt.error(f"ssm.inner_size = {inner} is not a whole number of the {value_heads} value heads "
                         "(ssm.time_step_rank)")
    if value_heads % key_heads:
        raise ckpt.error(f"ssm.time_step_rank = {value_heads} value heads do not split into "
                         f"ssm.group_count = {key_heads} key heads")
    recurrent = ckpt._typed("attention.recurrent_layers", "boolean array")
    if recurrent is None:
        interval = ckpt._int("full_attention_interval", 4, high=layers)
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    if len(recurrent) != layers:
        raise ckpt.error(f"attention.recurrent_layers must hold one boolean per layer ({layers})")
    recurrent = [bool(r) for r in recurrent]
    rope_dim = ckpt._int("rope.dimension_count", head_dim, high=head_dim)
    if rope_dim % 2:
        raise ckpt.error(f"rope.dimension_count = {rope_dim} is odd (rotary needs pairs)")
    sections = ckpt._typed("rope.dimension_sections", "integer array")
    rope = {"rope_type": "default", "rope_theta": ckpt._float("rope.freq_base", 10000.0),
            "partial_rotary_factor": rope_dim / head_dim}
    if sections is not None and len(sections) >= 3:
        # Interleaved multi-axis RoPE; for text every axis carries the same position.
        rope["mrope_section"] = [int(s) for s in sections[:3]]
    return {
        "layer_types": ["linear_attention" if r else "full_attention" for r in recurrent],
        "linear_conv_kernel_dim": kernel,
        "linear_key_head_dim": key_head_dim,
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": value_heads,
        "linear_value_head_dim": inner // value_heads,
        "rope_parameters": rope,
    }


def expected_shape(config: dict[str, Any], leaf: str, layer: Optional[int]) -> Optional[tuple[int, ...]]:
    """The shape (rows first) the config implies for a tensor of `layer` (None: global)."""
    hidden, ff = config["hidden_size"], config["intermediate_size"]
    hd, q, kv = config["head_dim"], config["num_attention_heads"] * config["head_dim"], \
        config["num_key_value_heads"] * config["head_dim"]
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    nv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
    value_dim = nv * dv
    conv_dim = 2 * key_dim + value_dim
    if layer is None:
        return {"output_norm.weight": (hidden,), "output.weight": (config["vocab_size"], hidden)}.get(leaf)
    common = {"attn_norm.weight": (hidden,), "post_attention_norm.weight": (hidden,),
              "ffn_gate.weight": (ff, hidden), "ffn_up.weight": (ff, hidden), "ffn_down.weight": (hidden, ff)}
    if config["layer_types"][layer] == "full_attention":
        own = {"attn_q.weight": (2 * q, hidden), "attn_k.weight": (kv, hidden), "attn_v.weight": (kv, hidden),
               "attn_output.weight": (hidden, q), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}
    else:
        own = {"attn_qkv.weight": (conv_dim, hidden), "attn_gate.weight": (value_dim, hidden),
               "ssm_beta.weight": (nv, hidden), "ssm_alpha.weight": (nv, hidden), "ssm_a": (nv,),
               "ssm_dt.bias": (nv,), "ssm_conv1d.weight": (conv_dim, config["linear_conv_kernel_dim"]),
               "ssm_norm.weight": (dv,), "ssm_out.weight": (hidden, value_dim)}
    return {**common, **own}.get(leaf, ())  # (): a name this layer kind does not have


def needs_fp32(leaf: str) -> bool:
    """Tensors whose stored values are changed back in FP32 before the serving dtype."""
    return leaf in _SHIFTED_NORMS or leaf in ("ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "attn_qkv.weight",
                                              "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
                                              "ssm_out.weight")


def _grouped(t: torch.Tensor, dim: int, key_heads: int, head_dim: int) -> torch.Tensor:
    """Value heads along `dim` from tiled (per_group, key_heads) order back to grouped (key_heads, per_group)."""
    shape = list(t.shape)
    per_group = shape[dim] // (key_heads * head_dim)
    split = t.reshape(*shape[:dim], per_group, key_heads, head_dim, *shape[dim + 1:])
    return split.transpose(dim, dim + 1).reshape(shape).contiguous()


def keeps_quantized(config: dict[str, Any], leaf: str, block_k: int) -> bool:
    """Whether a quantized tensor can be put in grouped order without dequantizing it: rows
    move as they are, but the output projection's value heads are columns, inside its blocks
    unless a head's Dv columns are whole blocks."""
    tiled = config["linear_num_key_heads"] != config["linear_num_value_heads"]
    return not (leaf == "ssm_out.weight" and tiled and config["linear_value_head_dim"] % block_k)


def quantized_in_hf_order(config: dict[str, Any], leaf: str, rows: np.ndarray) -> np.ndarray:
    """A kept tensor's GGML blocks (uint8 [rows, bytes per row]) with its value heads in
    grouped order, as to_hf puts the values: whole rows for the projections into value heads,
    whole blocks of each row for the output projection (keeps_quantized says when that is
    possible)."""
    if not _tiled_value_heads(config, leaf):
        return rows  # the file's read-only view, not copied
    return _value_heads_grouped(config, leaf, torch.from_numpy(rows.copy())).numpy()


_VALUE_HEAD_LEAVES = ("ssm_a", "ssm_dt.bias", "ssm_beta.weight", "ssm_alpha.weight", "attn_gate.weight",
                      "attn_qkv.weight", "ssm_conv1d.weight", "ssm_out.weight")


def _tiled_value_heads(config: dict[str, Any], leaf: str) -> bool:
    return config["linear_num_key_heads"] != config["linear_num_value_heads"] and leaf in _VALUE_HEAD_LEAVES


def _value_heads_grouped(config: dict[str, Any], leaf: str, t: torch.Tensor) -> torch.Tensor:
    """t (the values, or GGML blocks [rows, bytes per row]) with the value heads of its axis in
    grouped order; the output projection's heads are t.shape[1] / NV columns each (Dv values,
    or the bytes of their blocks)."""
    if not _tiled_value_heads(config, leaf):
        return t
    nk, nv, dv = config["linear_num_key_heads"], config["linear_num_value_heads"], config["linear_value_head_dim"]
    key_dim = nk * config["linear_key_head_dim"]
    if leaf in ("ssm_a", "ssm_dt.bias", "ssm_beta.weight", "ssm_alpha.weight"):
        return _grouped(t, 0, nk, 1)
    if leaf == "attn_gate.weight":
        return _grouped(t, 0, nk, dv)
    if leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
        return torch.cat([t[:2 * key_dim], _grouped(t[2 * key_dim:], 0, nk, dv)])
    return _grouped(t, 1, nk, t.shape[1] // nv)  # ssm_out.weight


def to_hf(config: dict[str, Any], leaf: str, t: torch.Tensor) -> torch.Tensor:
    """A tensor as the Hugging Face checkpoint holds it (its shape checked already)."""
    if leaf in _SHIFTED_NORMS:
        return t - 1.0
    if leaf == "ssm_a":
        if not bool((t < 0).all()):
            raise ValueError("holds a decay A that is not negative (the converter stores A = -exp(A_log))")
        t = torch.log(-t)
    t = _value_heads_grouped(config, leaf, t)
    return t.unsqueeze(1) if leaf == "ssm_conv1d.weight" else t

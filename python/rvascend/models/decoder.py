"""The decoder-only causal LM of the supported families.

Llama, Qwen2 and Qwen3 share one structure and differ in three switches that
come from the config: llama3 RoPE scaling, q/k/v bias (Qwen2) and per-head
q/k RMSNorm (Qwen3). q/k/v and gate/up are fused projections, as in SGLang and
vLLM, so the RVV policy sees one large Linear each.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from rvascend.models.config import ModelConfig
from rvascend.models.layers import FusedLinear, RMSNorm, RotaryEmbedding, SiluAndMul, apply_rotary, maybe_norm
from rvascend import ops
from rvascend.dispatch.route import projection_linear
from rvascend.dispatch.fused_decoder import ATTENTION, LayerParts, fused_decoder_of
from rvascend.dispatch.kernel_routes import routes_of


class RecurrentIndex(NamedTuple):
    """A batch as the recurrent layers see it (ForwardBatch.recurrent_index)."""
    slots: torch.Tensor                  # int64 [B]: the slot each sequence's states are written to
    lengths: Optional[torch.Tensor]      # int64 [B] new tokens, or None when every sequence decodes one
    starting: list[int]                  # slots of the sequences with no tokens before these (zeroed first)
    read_slots: Optional[torch.Tensor]   # int64 [B]: where the states are read from; None: `slots`
    token_slots: Optional[torch.Tensor]  # int64 [T]: -1, or a slot a token's states are also left in


@dataclasses.dataclass
class ForwardBatch:
    """Tokens of several sequences, concatenated; each sequence's K/V slots in the pool."""

    input_ids: torch.Tensor            # [T] int64
    positions: torch.Tensor            # [T] int64
    new_lens: list[int]                # new tokens per sequence (sum = T)
    prefix_lens: list[int]             # tokens already cached per sequence
    kv_slots: list[torch.Tensor]       # per sequence: slots of all its tokens (prefix + new)
    write_slots: torch.Tensor          # [T] slots the new tokens' K/V go to
    logit_rows: Optional[torch.Tensor] = None  # rows whose logits forward returns (default: each sequence's last)
    state_slots: Optional[list[int]] = None  # hybrid models: each sequence's recurrent-state slot (written)
    # Hybrid models with two slots per sequence: the slot each sequence's state is read from (its
    # state_slot is written, this one left as it was). None: states are updated in place.
    state_read_slots: Optional[list[int]] = None
    # Hybrid models' verify steps: per token (flat, [T]), -1 or a slot the states after that token
    # are also left in (each sequence's last token: -1, its states go to its state_slot).
    state_token_slots: Optional[list[int]] = None
    # The final norm's output of every row is left in `hidden` (a draft model's input).
    keep_hidden: bool = False
    hidden: Optional[torch.Tensor] = None
    _flat: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    _recurrent: Optional["RecurrentIndex"] = None

    @property
    def prefill(self) -> bool:
        """Whether some sequence has more than one new token (a prompt or a chunk of one)."""
        return self.input_ids.shape[0] > len(self.new_lens)

    @property
    def prefill_keys(self) -> int:
        """For a prefill, the most K/V slots any of its sequences attends over; else 0
        (what the attention route's gate reads)."""
        return max(p + n for p, n in zip(self.prefix_lens, self.new_lens)) if self.prefill else 0

    def recurrent_index(self) -> "RecurrentIndex":
        """The hybrid models' recurrent layers' view of the batch; built once per batch,
        shared by every layer."""
        if self._recurrent is None:
            decode = all(n == 1 and p > 0 for n, p in zip(self.new_lens, self.prefix_lens))
            read = None
            if self.state_read_slots is not None:
                # A sequence that starts here reads nothing: its written slot is zeroed and read.
                read = torch.tensor([w if p == 0 else r for w, r, p in
                                     zip(self.state_slots, self.state_read_slots, self.prefix_lens)], dtype=torch.int64)
            self._recurrent = RecurrentIndex(
                torch.tensor(self.state_slots, dtype=torch.int64),
                None if decode else torch.tensor(self.new_lens, dtype=torch.int64),
                [s for s, p in zip(self.state_slots, self.prefix_lens) if p == 0], read,
                None if self.state_token_slots is None else torch.tensor(self.state_token_slots, dtype=torch.int64))
        return self._recurrent

    def flat_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(all sequences' slots concatenated, kv_starts [B+1], q_starts [B+1]) for
        kv_pool_attention; built once per batch, shared by every layer."""
        if self._flat is None:
            kv_starts = list(itertools.accumulate((len(s) for s in self.kv_slots), initial=0))
            q_starts = list(itertools.accumulate(self.new_lens, initial=0))
            slots = self.kv_slots[0].contiguous() if len(self.kv_slots) == 1 else \
                torch.cat(self.kv_slots) if self.kv_slots else torch.zeros(0, dtype=torch.long)
            self._flat = (slots, torch.tensor(kv_starts, dtype=torch.long), torch.tensor(q_starts, dtype=torch.long))
        return self._flat


class KVPool:
    """Fixed per-token K/V storage: [layers][slots, kv_heads, head_dim], allocated once."""

    def __init__(self, config: ModelConfig, num_slots: int, dtype: torch.dtype, extra_layers: int = 0) -> None:
        """extra_layers: a draft head's attention layers, after the model's own."""
        shape = (num_slots, config.num_key_value_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(config.kv_layers + extra_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(config.kv_layers + extra_layers)]
        self.num_slots = num_slots
        self.states = None  # a hybrid model's recurrent states (models/state_pool.py), set by the engine

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * config.kv_layers * config.num_key_value_heads * config.head_dim * elem


class Attention(nn.Module):
    """The layer's attention in two calls: `project` (pure tensor work, compiled
    with the layer under regional compile) and `attend` (the KV pool)."""

    rvv_kernels = ("kv_pool_attention", "rope")

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.qkv_proj = FusedLinear(config.hidden_size, {
            "q": self.heads * self.head_dim, "k": self.kv_heads * self.head_dim,
            "v": self.kv_heads * self.head_dim}, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.scale = self.head_dim ** -0.5

    def project(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [T, heads, D], k and v [T, kv_heads, D]): qkv projection, q/k norm, RoPE."""
        t = h.shape[0]
        q, k, v = self.qkv_proj(h).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        v = v.reshape(t, self.kv_heads, self.head_dim)
        routes = routes_of(self)
        if routes is not None and routes.use("rope", q, cos, rows=t):
            # q/k RMSNorm (Qwen3) and RoPE in one pass, read from the qkv row in place.
            for norm in (self.q_norm, self.k_norm):
                if norm is not None and norm.weight.dtype != torch.bfloat16:
                    raise TypeError(f"q/k norm weight must be bfloat16 with BF16 activations, got {norm.weight.dtype}")
            q = ops.elementwise.rope(q, self.heads, self.q_norm.weight if self.q_norm else None,
                                     self.q_norm.eps if self.q_norm else 0.0, cos, sin)
            k = ops.elementwise.rope(k, self.kv_heads, self.k_norm.weight if self.k_norm else None,
                                     self.k_norm.eps if self.k_norm else 0.0, cos, sin)
            return q, k, v
        q = maybe_norm(self.q_norm, q.reshape(t, self.heads, self.head_dim))
        k = maybe_norm(self.k_norm, k.reshape(t, self.kv_heads, self.head_dim))
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
               pool: KVPool) -> torch.Tensor:
        """Writes k/v to the pool, attends over each sequence's slots; [T, heads * D]."""
        t = q.shape[0]
        k_cache, v_cache = pool.k[self.layer], pool.v[self.layer]
        routes = routes_of(self)
        if routes is not None and routes.use("kv_pool_attention", q, k, v, k_cache, rows=t,
                                             prefill_keys=batch.prefill_keys):
            kv_slots, kv_starts, q_starts = batch.flat_index()
            out = ops.kv_pool_attention(q, k_cache, v_cache, k, v, batch.write_slots, kv_slots, kv_starts,
                                        q_starts, self.scale)
            return out.reshape(t, self.heads * self.head_dim)
        k_cache[batch.write_slots] = k
        v_cache[batch.write_slots] = v
        out = torch.empty_like(q)
        start = 0
        for n, prefix, slots in zip(batch.new_lens, batch.prefix_lens, batch.kv_slots):
            # Four dimensions and enable_gqa: SDPA's flash kernel (a three-dimensional
            # call takes the math path, 2-4.5x slower) reading each KV head for its
            # group of query heads, without repeat_interleave's copies.
            qs = q[start:start + n].transpose(0, 1)[None]                    # [1, H, n, D]
            # index_select: advanced indexing (k_cache[slots]) takes a general
            # path that is an order of magnitude slower for this gather.
            ks = k_cache.index_select(0, slots).transpose(0, 1)[None]       # [1, KV, L, D]
            vs = v_cache.index_select(0, slots).transpose(0, 1)[None]
            if prefix == 0 and n > 1:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=True)
            elif n == 1:
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.scale, enable_gqa=True)
            else:
                length = prefix + n
                mask = torch.arange(length)[None, :] <= (prefix + torch.arange(n))[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale, enable_gqa=True)
            o = o[0]
            out[start:start + n] = o.transpose(0, 1)
            start += n
        return out.reshape(t, self.heads * self.head_dim)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = FusedLinear(config.hidden_size, {
            "gate": config.intermediate_size, "up": config.intermediate_size}, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(h)))


class DecoderLayer(nn.Module):
    # The layer's pure tensor work on either side of attention: with
    # --cpu-compile-mode regional the policy compiles each once, shared by every
    # layer (policy/regional_compile.py); attention, which reads the batch's
    # layout and the layer's KV pool, runs between them.
    rvv_regional_methods = ("before_attention", "after_attention")

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, h, residual, cos, sin, batch, pool):
        """(output, residual stream): the residual add is fused into the next norm."""
        q, k, v, residual = self.before_attention(h, residual, cos, sin)
        return self.after_attention(self.self_attn.attend(q, k, v, batch, pool), residual)

    def before_attention(self, h: torch.Tensor, residual: Optional[torch.Tensor], cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.add_forward(h, residual)
        q, k, v = self.self_attn.project(x, cos, sin)
        return q, k, v, residual

    def after_attention(self, attended: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.post_attention_layernorm.add_forward(self.self_attn.o_proj(attended), residual)
        return self.mlp(x), residual

    def describe(self) -> LayerParts:
        """Its parts for the fused step (dispatch/fused_decoder.py): an attention layer."""
        attn = self.self_attn
        return LayerParts(ATTENTION, self.input_layernorm, self.post_attention_layernorm,
                          (attn.qkv_proj, attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj),
                          attn.q_norm, attn.k_norm, attn.layer, attn)


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 for causal LM; `forward` returns the logits of the
    last new token of every sequence in the batch ([batch, vocab]), or of the
    batch's `logit_rows`."""

    rvv_kernels = ("argmax",)  # used by the engine's greedy sampling
    rvv_fused_decoder = True  # the policy may run a decode step's layers in one call (dispatch/fused_decoder.py)

    # checkpoint name -> (fused module attribute, shard)
    STACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
               "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.rotary = RotaryEmbedding(config)
        # Tied: one module and one weight, as SGLang does; the logits go through
        # projection_linear so the RVV policy can route them.
        self.lm_head = self.model.embed_tokens if config.tie_word_embeddings else \
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, batch: ForwardBatch, pool: KVPool, all_logits: bool = False) -> torch.Tensor:
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary(batch.positions, h.dtype)
        rows = None if all_logits else batch.logit_rows
        if rows is None and not all_logits and batch.prefill:  # else every sequence's one row is its last
            rows = torch.tensor(batch.new_lens).cumsum(0) - 1
        fused = fused_decoder_of(self)
        out = fused(h, cos, sin, batch, pool, rows) if fused is not None else None
        if out is not None:
            h, logits = out
            if logits is not None:
                return logits
        else:
            residual = None
            for layer in self.model.layers:
                h, residual = layer(h, residual, cos, sin, batch, pool)
            h, _ = self.model.norm.add_forward(h, residual)
        if batch.keep_hidden:
            batch.hidden = h
        if rows is not None:
            if rows.numel() == 0:  # a chunk of prompts that samples nothing yet
                return h.new_zeros(0, self.config.vocab_size)
            h = h[rows]
        return projection_linear(self.lm_head, h)

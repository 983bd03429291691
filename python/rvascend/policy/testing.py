"""Helpers the policy and packed-op tests share: a small model with SGLang's fused
projection names, and the packed layout written from its definition."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from rvascend.dispatch.route import projection_linear


class Layer(nn.Module):
    def __init__(self, hidden: int, inter: int, qkv_bias: bool) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=qkv_bias)
        self.self_attn.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, hidden, bias=False)
        self.hidden = hidden

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = self.self_attn.qkv_proj(h)[..., : self.hidden]
        h = h + self.self_attn.o_proj(torch.tanh(q))
        gate, up = self.mlp.gate_up_proj(h).chunk(2, dim=-1)
        return h + self.mlp.down_proj(F.silu(gate) * up)


class TinyDecoder(nn.Module):
    """Fused SGLang-style module names; lm_head IS embed_tokens when tied."""

    def __init__(self, hidden=1024, inter=2048, vocab=2048, layers=2, tie=True, qkv_bias=False):
        super().__init__()
        self.config = types.SimpleNamespace(tie_word_embeddings=tie)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden)
        self.model.layers = nn.ModuleList([Layer(hidden, inter, qkv_bias) for _ in range(layers)])
        self.lm_head = self.model.embed_tokens if tie else nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0, 0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h)
        return projection_linear(self.lm_head, h)


def make(**kw) -> TinyDecoder:
    torch.manual_seed(0)
    return TinyDecoder(**kw).to(torch.bfloat16)


def transformers_llama() -> nn.Module:
    """Hugging Face's Llama, one layer, 1024 wide (the seed's gate packs it), lm_head tied
    to the embedding by weight object, BF16, seeded."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                                      num_attention_heads=8, num_key_value_heads=4, vocab_size=2048,
                                      tie_word_embeddings=True, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()

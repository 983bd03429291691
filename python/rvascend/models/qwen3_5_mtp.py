"""Qwen3.5's multi-token-prediction head (the checkpoint's `mtp.*` tensors), the draft model
of `--speculative-algorithm NEXTN`.

Position i of a sequence goes in as the target's final hidden state there (after the final
norm) and the embedding of the token at i + 1; they are normed apart, concatenated
(embedding first) and projected back to the hidden size by `fc`, then run through one
full-attention decoder layer of the target's kind, with K/V of its own at the position's
slot (the pool's layer after the target's), and the head's own final norm. The target's
lm_head turns the result into logits for the token at i + 2; the head's output at a drafted
position goes back in as the hidden state of the next draft.

It shares the target's embedding and lm_head (the checkpoint stores neither again). With a
draft vocabulary (restrict_draft_vocab: a frequency-ranked subset, SGLang's
--speculative-token-map) its drafts come from those rows of the lm_head only: over Qwen3.5's
248k-entry vocabulary the full head is most of a draft's cost, and the verify step keeps the
full one, so the output does not change; only how many drafts are taken.
"""

from __future__ import annotations

import json
from typing import Optional

import torch
from torch import nn

from rvascend.models.config import ModelConfig
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.layers import RotaryEmbedding
from rvascend.models.qwen3_5 import HybridDecoderLayer, Qwen3_5CausalLM, ZeroCenteredRMSNorm
from rvascend.dispatch.route import projection_linear


def restrict_draft_vocab(model: CausalLM, token_ids: list[int]) -> None:
    """Makes the MTP head draft among `token_ids` only: their lm_head rows, copied into a
    projection of their own (call it before installing the kernels' policy, which packs it).
    The copy is taken now: weights loaded later leave it as it was (drafts, not outputs)."""
    if model.mtp is None:
        raise ValueError("a draft vocabulary restricts the MTP head: the model was loaded without one")
    vocab = model.config.vocab_size
    if not token_ids or len(set(token_ids)) != len(token_ids):
        raise ValueError(f"the draft vocabulary must be distinct token ids, got {len(token_ids)} with "
                         f"{len(token_ids) - len(set(token_ids))} repeated")
    bad = [t for t in token_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"draft vocabulary token {bad[0]} is outside the model's vocabulary of {vocab}")
    ids = torch.tensor(token_ids, dtype=torch.long)
    weight = model.lm_head.weight
    head = nn.Linear(weight.shape[1], len(token_ids), bias=False, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight[ids])
    model.mtp.draft_head = head
    model.mtp.register_buffer("draft_ids", ids, persistent=False)


def read_token_map(path: str) -> list[int]:
    """A draft vocabulary file: token ids as a JSON list or whitespace-separated text."""
    with open(path, encoding="utf-8") as f:
        text = f.read(64 << 20)
    try:
        ids = json.loads(text) if text.lstrip().startswith("[") else [int(x) for x in text.split()]
    except ValueError as e:
        raise ValueError(f"{path}: not a JSON list or whitespace-separated token ids ({e})") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{path}: the token map must list integer token ids")
    return ids


def add_mtp_head(model: CausalLM) -> None:
    """Gives a Qwen3.5 model its checkpoint's MTP head (model.mtp), parameters unset; its
    K/V are the pool's layer after the model's own."""
    if not isinstance(model, Qwen3_5CausalLM):
        raise ValueError(f"an MTP head is loaded for Qwen3.5 checkpoints, not {model.config.architecture}")
    if model.config.mtp_layers == 0:
        raise ValueError(f"{model.config.architecture} checkpoint has no MTP layer (mtp_num_hidden_layers is 0)")
    model.mtp = MultiTokenPredictor(model.config, model.config.kv_layers)


class MultiTokenPredictor(nn.Module):
    def __init__(self, config: ModelConfig, kv_layer: int) -> None:
        super().__init__()
        if config.mtp_layers != 1:
            raise ValueError(f"mtp_num_hidden_layers = {config.mtp_layers}: NEXTN drafts with exactly one MTP layer")
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([HybridDecoderLayer(config, "full_attention", kv_layer)])
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.draft_head: nn.Linear | None = None  # restrict_draft_vocab
        self.register_buffer("draft_ids", None, persistent=False)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, rotary: RotaryEmbedding, batch: ForwardBatch,
                pool: KVPool) -> torch.Tensor:
        """The head's output hidden states [T, H] for `batch`, whose input_ids are the next
        tokens (embedded: their embeddings) and whose positions are the hidden states'."""
        if hidden.shape != embedded.shape:
            raise ValueError(f"the MTP head takes one hidden state per token: {tuple(hidden.shape)} for "
                             f"{tuple(embedded.shape)} embeddings")
        x = torch.cat((self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden.to(embedded.dtype))), -1)
        h = projection_linear(self.fc, x)
        cos, sin = rotary(batch.positions, h.dtype)
        h, residual = self.layers[0](h, None, cos, sin, batch, pool)
        h, _ = self.norm.add_forward(h, residual)
        return h

    def draft_logits(self, lm_head: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The logits of the head's outputs `h` and the token id of each column: over the
        draft vocabulary when there is one (restrict_draft_vocab), else the whole (None)."""
        if self.draft_head is None:
            return projection_linear(lm_head, h), None
        return projection_linear(self.draft_head, h), self.draft_ids

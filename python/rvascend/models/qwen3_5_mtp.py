"""Qwen3.5's multi-token-prediction head (the checkpoint's `mtp.*` tensors), the draft model
of `--speculative-algorithm NEXTN`.

Position i of a sequence goes in as the target's final hidden state there (after the final
norm) and the embedding of the token at i + 1; they are normed apart, concatenated
(embedding first) and projected back to the hidden size by `fc`, then run through one
full-attention decoder layer of the target's kind, with K/V of its own at the position's
slot (the pool's layer after the target's), and the head's own final norm. The target's
lm_head turns the result into logits for the token at i + 2; the head's output at a drafted
position goes back in as the hidden state of the next draft.

It shares the target's embedding and lm_head (the checkpoint stores neither again).
"""

from __future__ import annotations

import torch
from torch import nn

from rvascend.models.config import ModelConfig
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.layers import RotaryEmbedding
from rvascend.models.qwen3_5 import HybridDecoderLayer, Qwen3_5CausalLM, ZeroCenteredRMSNorm
from rvascend.dispatch.route import projection_linear


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

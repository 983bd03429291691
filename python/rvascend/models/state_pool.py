"""A hybrid model's recurrent state per sequence, beside the KV pool.

Gated DeltaNet layers keep no K/V. Each running sequence owns two slots, taken
at admission and given back when it ends (finished, aborted or failed), and
per linear-attention layer a slot holds:

- the short causal conv's last `conv_kernel - 1` inputs, [conv_dim, kernel - 1];
- the delta rule's state, [value heads, Dv, Dk] in FP32, the layout of
  `torch.ops.rvascend.recurrent_gated_delta_rule`'s pool (Dk contiguous).

A sequence's first step (no tokens before it) starts from zeros whatever its
slot held, so slots need no clearing. A step reads a sequence's states from
one of its slots and writes them to the other (the ops' `read_slots`), and the
engine swaps the two when the step commits: a step that fails leaves the states
it read as they were, with no undo copy. (An undo copy per step, 18 MB a
sequence for Qwen3.5-0.8B, took 2.3 ms of a 22 ms x86 decode step into buffers
kept for it, and 11 ms freshly allocated.)
"""

from __future__ import annotations

import torch

from rvascend.models.config import ModelConfig


class RecurrentStatePool:
    def __init__(self, config: ModelConfig, num_slots: int, conv_dtype: torch.dtype) -> None:
        linear = config.linear_attention
        if linear is None or config.layer_types is None:
            raise ValueError(f"{config.architecture} has no linear-attention layers: it needs no state pool")
        layers = sum(t == "linear_attention" for t in config.layer_types)
        self.conv = [torch.zeros(num_slots, linear.conv_dim, linear.conv_kernel - 1, dtype=conv_dtype)
                     for _ in range(layers)]
        self.ssm = [torch.zeros(num_slots, linear.num_value_heads, linear.value_head_dim, linear.key_head_dim,
                                dtype=torch.float32) for _ in range(layers)]
        self.num_slots = num_slots

    @staticmethod
    def bytes_per_slot(config: ModelConfig, conv_dtype: torch.dtype) -> int:
        """A slot's states."""
        linear = config.linear_attention
        layers = sum(t == "linear_attention" for t in config.layer_types)
        elem = torch.empty((), dtype=conv_dtype).element_size()
        return layers * (linear.conv_dim * (linear.conv_kernel - 1) * elem
                         + linear.num_value_heads * linear.value_head_dim * linear.key_head_dim * 4)

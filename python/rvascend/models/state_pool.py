"""A hybrid model's recurrent state per sequence, beside the KV pool.

Gated DeltaNet layers keep no K/V. Each running sequence owns one slot, taken
at admission and given back when it ends (finished, aborted or failed), and
per linear-attention layer the slot holds:

- the short causal conv's last `conv_kernel - 1` inputs, [conv_dim, kernel - 1];
- the delta rule's state, [value heads, Dv, Dk] in FP32, the layout of
  `torch.ops.rvascend.recurrent_gated_delta_rule`'s pool (Dk contiguous).

A sequence's first step (no tokens before it) starts from zeros whatever its
slot held, so slots need no clearing. Decode steps update the states in place;
`snapshot` / `restore` let the engine undo a step that fails. The snapshot goes
to buffers allocated with the pool (as many rows as slots, so the pool's memory
is twice the states'): a fresh 18 MB allocation per step (Qwen3.5-0.8B, one
sequence) took each page's fault and clearing on every step, 11 ms of a 30 ms
x86 decode step, where the copy alone is about 2 ms.
"""

from __future__ import annotations

import torch

from rvascend.models.config import ModelConfig
from rvascend.ops import elementwise


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
        self._saved = [t.new_empty(t.shape) for t in self.conv + self.ssm]

    @staticmethod
    def bytes_per_slot(config: ModelConfig, conv_dtype: torch.dtype) -> int:
        """A slot's states; the pool holds twice this per slot (the states and their undo copy)."""
        linear = config.linear_attention
        layers = sum(t == "linear_attention" for t in config.layer_types)
        elem = torch.empty((), dtype=conv_dtype).element_size()
        return layers * (linear.conv_dim * (linear.conv_kernel - 1) * elem
                         + linear.num_value_heads * linear.value_head_dim * linear.key_head_dim * 4)

    def snapshot(self, slots: list[int]) -> list[torch.Tensor]:
        """Copies of `slots` (one tensor per pool tensor, slot i of it at row i), valid until
        the next snapshot: they live in the pool's undo buffers."""
        if len(slots) > self.num_slots:
            raise ValueError(f"snapshot of {len(slots)} slots: the pool has {self.num_slots}")
        saved = []
        for t, buffer in zip(self.conv + self.ssm, self._saved):
            rows = buffer[:len(slots)]
            for i, slot in enumerate(slots):
                elementwise.copy_(rows[i], t[slot])
            saved.append(rows)
        return saved

    def restore(self, slots: list[int], saved: list[torch.Tensor]) -> None:
        for t, rows in zip(self.conv + self.ssm, saved):
            for i, slot in enumerate(slots):
                elementwise.copy_(t[slot], rows[i])

"""Helpers the model tests share: whole-prompt logits and greedy continuations."""

from __future__ import annotations

from typing import Union

import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool


def all_logits(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    """FP32 logits at every position of one prompt, from a fresh KV pool."""
    n = ids.shape[0]
    batch = ForwardBatch(ids, torch.arange(n), [n], [0], [torch.arange(n)], torch.arange(n))
    with torch.inference_mode():
        return model(batch, KVPool(model.config, n, next(model.parameters()).dtype), all_logits=True).float()


def greedy(model: CausalLM, ids: Union[list[int], torch.Tensor], n: int) -> list[int]:
    """n greedy tokens after `ids` through the engine (EOS ignored); the pool must end empty."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    engine = Engine(model, None, EngineConfig(max_total_tokens=len(ids) + n + 64))
    (seq,) = engine.generate([ids], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    assert engine.stats()["kv_used_tokens"] == 0
    return seq.output_ids

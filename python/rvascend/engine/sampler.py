"""Greedy, temperature and nucleus (top-p) sampling, per sequence."""

from __future__ import annotations

from typing import Optional

import torch

from rvascend.engine.sequence import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    """One token id from a [vocab] row of logits."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (always the first token).
        keep = cumulative - sorted_probs < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())

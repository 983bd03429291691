"""Sampling one token per sequence: penalties, logit bias, temperature, top-k,
top-p, min-p, and the log-probabilities a request asks for.

Never NaN and never an empty candidate set: probabilities come from logits
shifted so that the best is 0, and the most probable token always survives
top-k, top-p and min-p, however small their values. Logits of +inf are the
whole support: the token is drawn among them (the first of them when greedy),
as the limit of a softmax would. NaN logits fail the request (SamplingError).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from rvascend.engine.sequence import SamplingParams


class SamplingError(RuntimeError):
    """The model's output cannot be sampled (e.g. NaN logits): fails one request."""


@dataclasses.dataclass
class Sampled:
    token: int
    logprob: Optional[float] = None
    top_logprobs: Optional[list[tuple[int, float]]] = None


def _apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                     output_ids: Sequence[int]) -> torch.Tensor:
    vocab = logits.shape[0]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long).unique()
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                   values * params.repetition_penalty)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)[:vocab].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator],
           prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = (),
           eos_ids: Sequence[int] = (), allowed: Optional[torch.Tensor] = None) -> Sampled:
    """One token from a [vocab] row of logits; `allowed` (bool [vocab]) masks out the
    tokens a grammar forbids, for greedy and sampled draws alike."""
    logits = logits.float()
    if torch.isnan(logits).any() or not torch.isfinite(logits).any():
        raise SamplingError("the model produced NaN or no finite logits for this sequence")
    raw = logits
    logits = logits.clone()
    for token, bias in params.logit_bias:
        logits[token] += bias
    logits = _apply_penalties(logits, params, prompt_ids, output_ids)
    if allowed is not None:
        width = min(allowed.shape[0], logits.shape[0])
        logits[width:] = float("-inf")
        logits[:width].masked_fill_(~allowed[:width], float("-inf"))
        if bool(torch.isneginf(logits).all()):
            raise SamplingError("the grammar allows no token the model can produce here")
    if len(output_ids) < params.min_tokens:
        banned = [t for t in (*eos_ids, *params.stop_token_ids) if 0 <= t < logits.shape[0]]
        if banned:
            held = logits.clone()
            held[banned] = float("-inf")
            # Where a grammar allows only ending tokens, the grammar wins over min_tokens
            # (as max_tokens does): banning them would leave nothing to draw.
            if not bool(torch.isneginf(held).all()):
                logits = held
    infinite = torch.isposinf(logits).nonzero().flatten()
    if params.greedy:
        token = int(torch.argmax(logits).item())
    elif len(infinite):
        token = int(infinite[torch.randint(len(infinite), (1,), generator=generator)].item())
    else:
        token = _draw(logits, params, generator)
    result = Sampled(token)
    if params.logprobs is not None:
        logprobs = log_softmax(raw)
        result.logprob = float(logprobs[token])
        if params.logprobs > 0:
            values, ids = logprobs.topk(min(params.logprobs, logprobs.shape[0]))
            result.top_logprobs = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist())]
    return result


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dimension, where +inf logits share all the mass."""
    infinite = torch.isposinf(logits)
    if not infinite.any():
        return torch.log_softmax(logits, dim=-1)
    count = infinite.sum(-1, keepdim=True).float()
    return torch.where(infinite, -torch.log(count), torch.full_like(logits, float("-inf")))


def plain_greedy(params: SamplingParams, outputs_so_far: int) -> bool:
    """True when the next token is just the argmax of the raw logits (no bias,
    penalty, masking or log-probabilities to compute)."""
    return (params.greedy and params.logprobs is None and not params.logit_bias and params.grammar is None
            and params.repetition_penalty == 1.0 and not params.frequency_penalty
            and not params.presence_penalty and outputs_so_far >= params.min_tokens)


def propose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """A draft's token for one position, from a drafting model's [vocab] logits there:
    greedy, its argmax; sampled, the draw `sample` would make from them with the generator
    the target's draw at that position will use (Sequence.generator_at). The draws are an
    exponential race over the same noise, so where the two models' distributions are
    close they pick the same token far more often than the draft's argmax would be the
    target's draw. Penalties, grammars and min_tokens are left to the target's draw:
    verification keeps the output exact whatever a proposal is."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    logits = logits.float()
    if torch.isnan(logits).any() or not torch.isfinite(logits).any():  # any token will do as a proposal
        return int(torch.argmax(torch.nan_to_num(logits, nan=float("-inf"))).item())
    if params.logit_bias:
        logits = logits.clone()
        for token, bias in params.logit_bias:
            logits[token] += bias
    infinite = torch.isposinf(logits).nonzero().flatten()
    if len(infinite):
        return int(infinite[0])
    return _draw(logits, params, generator)


def proposals(logits: torch.Tensor, seqs: Sequence, indices: Sequence[int],
              vocab_ids: Optional[torch.Tensor] = None, vocab_size: int = 0) -> list[int]:
    """A drafting model's token for each row of `logits` [n, columns]: row i drafts output
    token indices[i] of seqs[i] (propose). `vocab_ids`: the token id of each column, when
    the logits cover part of a vocabulary of `vocab_size` tokens (a draft vocabulary)."""
    best = logits.argmax(-1)
    tokens = (best if vocab_ids is None else vocab_ids[best]).tolist()
    for i, (seq, index) in enumerate(zip(seqs, indices)):
        if seq.params.greedy:
            continue
        row = logits[i].float()
        if vocab_ids is not None:  # the noise is indexed by token id: the row over the whole vocabulary
            row = torch.full((vocab_size,), float("-inf")).index_copy_(0, vocab_ids, row)
        tokens[i] = propose(row, seq.params, seq.generator_at(index))
    return tokens


def _draw(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]) -> int:
    # Shifted so the best logit is 0: exp() of it is 1, so the weights sum to
    # at least 1 whatever the temperature (no overflow, no 0/0).
    z = (logits - logits.max()) / params.temperature
    if params.top_k > 0 and params.top_k < z.shape[0]:
        kth = z.topk(params.top_k).values[-1]
        z = torch.where(z >= kth, z, torch.full_like(z, float("-inf")))
    weights = torch.exp(z)
    if params.top_p < 1.0 or params.min_p > 0.0:
        probs = weights / weights.sum()
        ranked, order = _ranked(probs, params)
        keep = torch.ones_like(ranked, dtype=torch.bool)
        if params.top_p < 1.0:
            # The smallest prefix whose mass reaches top_p; the first always stays.
            keep &= (ranked.cumsum(-1) - ranked) < params.top_p
        if params.min_p > 0.0:
            keep &= ranked >= params.min_p * ranked[0]
        keep[0] = True
        kept = order[keep]
        weights = torch.zeros_like(weights).index_copy_(0, kept, weights[kept])
    # The exponential race: token v wins with probability weights[v] / sum(weights). The noise
    # is indexed by token id, never by rank, so a drafting model drawing with the same
    # generator (propose) meets the same noise on every token.
    noise = -torch.log(torch.rand(weights.shape, generator=generator).add_(_HALF_STEP))
    race = torch.where(weights > 0, weights / noise, torch.full_like(weights, -1.0))
    return int(torch.argmax(race).item())


# Exp(1) noise as -log(U), U uniform on (0, 1): torch.rand's multiples of 2**-24 moved half a
# step up, so no noise is 0 (a token's weight over it would win outright) and none is
# infinite. Four times cheaper than exponential_ (1.2 against 5.2 ms over 152k tokens).
_HALF_STEP = 2.0**-25


# Top-p and min-p keep a prefix of the tokens by probability: where this many of the most
# probable already end it, only they are sorted (a full sort of a 152k vocabulary is most
# of a draw's time, and a draft's proposal is a draw).
_RANKED = 1024


def _ranked(probs: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The probabilities in descending order and their token ids: a prefix holding every
    token top-p and min-p can keep, or all of them."""
    if probs.shape[0] > _RANKED:
        top, order = probs.topk(_RANKED)
        if (params.top_p < 1.0 and float(top.sum()) >= params.top_p) or \
                (params.min_p > 0.0 and float(top[-1]) < params.min_p * float(top[0])):
            return top, order
    return probs.sort(descending=True)

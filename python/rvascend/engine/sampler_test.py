"""The sampler's draw and a draft's proposal: the draw is distributed as the filtered
softmax, and a drafting model's proposal, drawn with the generator the target's draw
uses, agrees with it far more often than the draft's argmax would."""

from __future__ import annotations

import torch

from rvascend.engine import sampler
from rvascend.engine.sequence import SamplingParams, Sequence


def _counts(logits: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    drawn = [sampler.sample(logits, params, torch.Generator().manual_seed(s)).token for s in range(n)]
    return torch.bincount(torch.tensor(drawn), minlength=logits.shape[0]).double()


def _kept_softmax(logits: torch.Tensor, params: SamplingParams, kept: list[int]) -> torch.Tensor:
    z = torch.full_like(logits, float("-inf"), dtype=torch.float64)
    z[kept] = logits[kept].double() / params.temperature
    return torch.softmax(z, -1)


def test_the_draw_is_the_filtered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 3.0, -0.5, 1.5])
    n = 12_000
    cases = [(SamplingParams(temperature=0.7, top_k=4), [5, 0, 7, 1]),
             # softmax at T = 1: 0.50, 0.18, 0.11, 0.07, ... top_p 0.75 keeps the first three
             (SamplingParams(temperature=1.0, top_p=0.75), [5, 0, 7]),
             (SamplingParams(temperature=1.3), list(range(8)))]
    for params, kept in cases:
        expected = _kept_softmax(logits, params, kept) * n
        counts = _counts(logits, params, n)
        assert set(counts.nonzero().flatten().tolist()) <= set(kept)
        spread = (expected * (1 - expected / n)).sqrt()
        assert ((counts - expected).abs() <= 5 * spread + 1).all(), (params, counts, expected)


def test_a_close_draft_proposes_what_the_target_draws():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1000, generator=g) * 2.5
    draft = target + 0.25 * torch.randn(1000, generator=g)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    n = 2000
    agree = sum(sampler.propose(draft, params, torch.Generator().manual_seed(s))
                == sampler.sample(target, params, torch.Generator().manual_seed(s)).token for s in range(n)) / n
    p, q = torch.softmax(target.double(), -1), torch.softmax(draft.double(), -1)
    tv = float(0.5 * (p - q).abs().sum())
    # The exponential race's coupling keeps at least (1 - TV) / (1 + TV) of the draws the same.
    assert agree >= (1 - tv) / (1 + tv) - 0.03
    assert agree > float(p[draft.argmax()]) + 0.3  # what argmax drafts would get
    same = sum(sampler.propose(target, params, torch.Generator().manual_seed(s))
               == sampler.sample(target, params, torch.Generator().manual_seed(s)).token for s in range(200))
    assert same == 200
    assert sampler.propose(draft, SamplingParams(temperature=0), None) == int(draft.argmax())


def test_each_output_position_has_its_own_stream():
    seq = Sequence([1, 2, 3], SamplingParams(temperature=1.0, seed=5))
    again = Sequence([9], SamplingParams(temperature=1.0, seed=5))
    other = Sequence([1, 2, 3], SamplingParams(temperature=1.0, seed=6))
    draws = [torch.rand(4, generator=seq.generator_at(i)) for i in range(3)]
    assert torch.equal(draws[0], torch.rand(4, generator=again.generator_at(0)))
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    assert not torch.equal(draws[0], torch.rand(4, generator=other.generator_at(0)))
    unseeded = [Sequence([1], SamplingParams(temperature=1.0)).sampling_seed for _ in range(3)]
    assert len(set(unseeded)) == 3


def test_a_draft_vocabulary_meets_the_noise_of_its_token_ids():
    """Logits over part of the vocabulary (a NEXTN draft vocabulary): each column meets the
    noise of its token id, so where the target's distribution lives on that part the
    proposal is the target's draw."""
    g = torch.Generator().manual_seed(1)
    vocab, part = 300, torch.tensor([3, 40, 41, 77, 150, 299])
    target = torch.full((vocab,), float("-inf"))
    target[part] = torch.randn(len(part), generator=g)
    seqs = [Sequence([1], SamplingParams(temperature=1.0, seed=s)) for s in range(60)]
    drawn = [sampler.sample(target, seq.params, seq.generator_at(4)).token for seq in seqs]
    proposed = sampler.proposals(target[part].repeat(len(seqs), 1), seqs, [4] * len(seqs), part, vocab)
    assert proposed == drawn and len(set(drawn)) > 2
    greedy = Sequence([1], SamplingParams(temperature=0))
    assert sampler.proposals(target[part][None], [greedy], [0], part, vocab) == [int(target.argmax())]


def test_top_p_and_min_p_keep_the_same_tokens_over_a_large_vocabulary():
    """Over more tokens than are ranked first (sampler._RANKED), a nucleus that ends within
    them and one that does not draw from the same sets as the full sort's."""
    g = torch.Generator().manual_seed(2)
    flat = torch.randn(5000, generator=g) * 0.1  # a flat distribution: top_p 0.9 needs thousands of tokens
    peaked = torch.randn(5000, generator=g) * 4
    for logits, params in [(flat, SamplingParams(temperature=1.0, top_p=0.9)),
                           (peaked, SamplingParams(temperature=1.0, top_p=0.9)),
                           (flat, SamplingParams(temperature=1.0, min_p=0.5)),
                           (peaked, SamplingParams(temperature=0.8, top_p=0.95, min_p=0.01))]:
        probs = torch.softmax(logits.double() / params.temperature, -1)
        ranked, order = probs.sort(descending=True)
        keep = torch.ones_like(ranked, dtype=torch.bool)
        if params.top_p < 1.0:
            keep &= (ranked.cumsum(-1) - ranked) < params.top_p
        if params.min_p > 0.0:
            keep &= ranked >= params.min_p * ranked[0]
        allowed = set(order[keep].tolist())
        drawn = {sampler.sample(logits, params, torch.Generator().manual_seed(s)).token for s in range(300)}
        assert drawn <= allowed and len(drawn) > 1
        if len(allowed) > 1024:  # the full sort's path: the draws reach past the first 1024
            assert len(drawn - set(order[:1024].tolist())) > 0

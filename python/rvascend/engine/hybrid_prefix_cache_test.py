"""The prefix cache of a hybrid model (Qwen3.5: Gated DeltaNet layers beside full attention):
a request resumes after the longest cached prefix that ends at a recurrent-state snapshot,
and answers exactly as with no cache (FP32, and BF16 under deterministic inference, logprobs
included), chunked or not, with speculative drafts, n > 1, aborts, failed steps and weight
changes; snapshot slots are bounded and never leak."""

from __future__ import annotations

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.testing import drafts_as_asked, load_exact_or_fp32  # noqa: F401 - drafts_as_asked: autouse
from rvascend.models.testing import TINY_QWEN3_5, write_random_checkpoint



GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def path():
    return write_random_checkpoint(TINY_QWEN3_5)


@pytest.fixture(scope="module", params=["float32", "bf16_deterministic"])
def model(request, path):
    return load_exact_or_fp32(path, request.param)


def _engine(model, **config) -> Engine:
    return Engine(model, None, EngineConfig(**{"max_total_tokens": 2048, "chunked_prefill_size": 24,
                                               "mamba_track_interval": 32, **config}))


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(2, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _same(model, got, want) -> bool:
    """Answers (tokens, logprobs, top logprobs) equal: bit for bit where the model is exact."""
    if model.exact or got == want:
        return got == want
    return got[0] == want[0] and torch.allclose(torch.tensor(got[1]), torch.tensor(want[1]), atol=1e-4)


def _answers(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY):
    """Each prompt's (tokens, logprobs, top logprobs) and the sequences."""
    outputs = [[] for _ in prompts]
    seqs = [engine.add_request(p, params, on_output=lambda s, o, i=i: outputs[i].append(o))
            for i, p in enumerate(prompts)]
    while any(not s.finish_reason for s in seqs):
        engine.step()
    return [(s.output_ids, [o.logprob for o in out if o.token_id is not None],
             [o.top_logprobs for o in out if o.token_id is not None]) for s, out in zip(seqs, outputs)], seqs


def _assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats["kv_used_tokens"] == 0 and stats["kv_reserved_tokens"] == 0
    assert stats["state_slots_free"] == stats["state_slots_total"]
    cache = engine.cache
    assert len(cache.free_states) + cache.snapshots == cache.state_slots == engine.config.max_mamba_cache_size
    assert not any(n.state_pins for n in cache._nodes())


def test_turns_resume_at_the_last_turns_end_and_answer_as_without_the_cache(model):
    """A conversation: each turn's prompt is the last turn's prompt, its answer and new
    tokens. Every turn after the first prefills only the new tokens (and the answer's last
    token, whose K/V were never computed) and answers exactly as a cache-less engine."""
    cached, plain = _engine(model), _engine(model, disable_radix_cache=True)
    prompt = _tokens(100, 0)
    for turn in range(3):
        (want,), _ = _answers(plain, [prompt])
        (got,), (seq,) = _answers(cached, [prompt])
        assert _same(model, got, want), turn
        if turn:
            assert seq.cached_tokens == previous, (turn, seq.cached_tokens, previous)
        previous = len(prompt) + len(seq.output_ids) - 1
        prompt = prompt + seq.output_ids + _tokens(15, turn + 1)
    _assert_nothing_held(cached)
    assert cached.stats()["mamba_cache_snapshots"] > 0


def test_a_shared_system_prompt_resumes_at_its_last_tracked_snapshot(model):
    """Prompts sharing 80 tokens then differing: the cached prefix ends at the last multiple
    of mamba_track_interval inside the shared part (the states there were kept during the
    first prompt's prefill, inside a chunk and at a chunk's end alike)."""
    system = _tokens(80, 3)
    prompts = [system + _tokens(12, 10 + i) for i in range(3)]
    for chunk in (24, 32, None):  # 32: snapshots at chunk ends only; None: whole prompts
        cached = _engine(model, chunked_prefill_size=chunk)
        plain = _engine(model, chunked_prefill_size=chunk, disable_radix_cache=True)
        for i, prompt in enumerate(prompts):
            (want,), _ = _answers(plain, [prompt])
            (got,), (seq,) = _answers(cached, [prompt])
            assert _same(model, got, want), (chunk, i)
            assert seq.cached_tokens == (0 if i == 0 else 64), (chunk, i)
        _assert_nothing_held(cached)


def test_the_same_prompt_twice_and_n_copies_resume_at_its_last_cacheable_token(model):
    prompt = _tokens(50, 4)
    cached, plain = _engine(model), _engine(model, disable_radix_cache=True)
    (want,), _ = _answers(plain, [prompt])
    assert _same(model, _answers(cached, [prompt])[0][0], want)
    (again,), seqs = _answers(cached, [prompt])
    assert _same(model, again, want) and seqs[0].cached_tokens == len(prompt) - 1
    fresh = _engine(model)
    together, seqs = _answers(fresh, [prompt] * 3)  # n = 3: the copies wait for the first's prefill
    assert all(_same(model, got, want) for got in together)
    assert sorted(s.cached_tokens for s in seqs) == [0, len(prompt) - 1, len(prompt) - 1]
    _assert_nothing_held(fresh)


def test_seeded_sampling_and_logprobs_are_the_same_from_the_cache(model):
    params = SamplingParams(max_tokens=5, temperature=0.9, seed=7, logprobs=3, ignore_eos=True)
    prompt = _tokens(70, 5)
    cached, plain = _engine(model), _engine(model, disable_radix_cache=True)
    cached.generate([prompt], params)
    (got,), (seq,) = _answers(cached, [prompt + _tokens(3, 6)], params)
    (want,), _ = _answers(plain, [prompt + _tokens(3, 6)], params)
    assert seq.cached_tokens == len(prompt) - 1
    assert _same(model, got, want) and all(lp is not None for lp in got[1])


def test_ngram_drafts_with_the_cache_answer_as_decoding(model):
    prompt = [5, 6, 7, 8, 9, 10] * 10
    plain = _engine(model, disable_radix_cache=True)
    spec = _engine(model, speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=1)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for turn in range(2):
        (want,), _ = _answers(plain, [prompt], params)
        (got,), (seq,) = _answers(spec, [prompt], params)
        assert _same(model, got, want), turn
        prompt = prompt + seq.output_ids + [5, 6, 7]
    assert spec.stats()["spec_accepted_tokens"] > 0
    _assert_nothing_held(spec)


def test_snapshots_stay_within_their_pool_least_recently_used_going_first(model):
    engine = _engine(model, max_mamba_cache_size=2)
    plain = _engine(model, disable_radix_cache=True)
    prompts = [_tokens(70, 20 + i) for i in range(4)]
    for prompt in prompts:
        assert _same(model, _answers(engine, [prompt])[0][0], _answers(plain, [prompt])[0][0])
        assert engine.stats()["mamba_cache_snapshots"] <= 2
    assert engine.stats()["mamba_cache_evictions"] > 0
    # The newest request's two deepest snapshots survived (after 64 tokens, taken while
    # prefilling, and at its end, beyond its prompt); the oldest request's are gone.
    (_, (seq,)) = _answers(engine, [prompts[-1]])
    assert seq.cached_tokens == 64
    (_, (seq,)) = _answers(engine, [prompts[0]])
    assert seq.cached_tokens == 0
    _assert_nothing_held(engine)


def test_aborts_failures_and_weight_changes_give_every_snapshot_back(model, monkeypatch):
    engine = _engine(model)
    prompt = _tokens(90, 8)
    engine.generate([prompt], GREEDY)
    # Aborted while prefilling the rest after a cached prefix (its snapshot pinned, then read).
    seq = engine.add_request(prompt + _tokens(60, 9), GREEDY)
    engine.step()
    assert seq.cached_tokens == len(prompt) - 1
    engine.abort(seq)
    engine.step()
    _assert_nothing_held(engine)
    # A step that fails before its commit gives its snapshot slots back.
    from rvascend.engine import model_runner

    def broken(self, plan, *args):
        raise RuntimeError("injected")

    monkeypatch.setattr(model_runner.ModelRunner, "run", broken)
    (failed,) = engine.generate([_tokens(80, 11)], GREEDY)
    assert failed.finish_reason == "error"
    monkeypatch.undo()
    _assert_nothing_held(engine)
    # The weights change: every snapshot is retired with its K/V.
    assert engine.stats()["mamba_cache_snapshots"] > 0
    with torch.no_grad():
        next(model.parameters()).add_(0)
    model.load_state_dict(model.state_dict())
    (seq,) = engine.generate([prompt], GREEDY)
    assert seq.cached_tokens == 0
    _assert_nothing_held(engine)
    assert engine.flush_cache() and engine.stats()["mamba_cache_snapshots"] == 0
    _assert_nothing_held(engine)

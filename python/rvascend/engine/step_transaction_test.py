"""An engine step is a transaction: a failure before commit changes nothing, so a
retried step cannot emit twice, take a second slot for a token, or skip a draw of a
seeded generator; cached K/V never outlive the weights that computed them; a request
waiting for a shared prefill does not hold up the requests behind it; steps called
from several threads (the server's engine thread and a caller's `generate`) run one
after another."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams, sampler
from rvascend.engine import model_runner
from rvascend.models.random_model import ensure_random_model
from rvascend.engine.sequence import Status
from rvascend.models.loader import load_model


@pytest.fixture(scope="module")
def model():
    return load_model(ensure_random_model(), torch.float32)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(2, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model, **config) -> Engine:
    return Engine(model, None, EngineConfig(**{"max_total_tokens": 512, "chunked_prefill_size": 16, **config}))


def _snapshot(engine: Engine) -> dict:
    seqs = sorted(engine.scheduler.running, key=lambda s: s.id)
    return {
        "free": sorted(engine.scheduler.free_slots), "reserved": engine.scheduler.reserved,
        "cache": (engine.cache.size, engine.cache.locked_size) if engine.cache else None,
        "seqs": [(s.id, list(s.slots), s.prefilled, list(s.output_ids), s.status, s.finish_reason, s.emitted,
                  s.reserved, len(s.token_times), len(s.input_logprobs), s.sampling_seed) for s in seqs],
    }


def _mid_flight(model) -> tuple[Engine, list]:
    """An engine with a decoding seeded sampler, a decoding greedy sequence asking for
    log-probabilities, and a prompt still prefilling that asks for prompt log-probabilities."""
    engine = _engine(model)
    seqs = [engine.add_request(_prompt(20, 1), SamplingParams(max_tokens=30, temperature=1.0, seed=7)),
            engine.add_request(_prompt(12, 2), SamplingParams(max_tokens=30, temperature=0, logprobs=2))]
    for _ in range(4):
        engine.step()
    seqs.append(engine.add_request(_prompt(40, 3), SamplingParams(max_tokens=4, temperature=0, logprobs=0,
                                                                  logprob_start_len=0)))
    engine.step()
    assert seqs[2].status is Status.RUNNING and seqs[2].prefilling and not seqs[0].prefilling
    return engine, seqs


def _work(engine: Engine) -> list:
    decoding = [s for s in engine.scheduler.running if not s.prefilling]
    return [(s, 1) for s in decoding] + engine.scheduler.prefill_chunk([s for s in engine.scheduler.running if s.prefilling],
                                                                   engine.config.chunked_prefill_size)


@pytest.mark.parametrize("stage", ["take_slots", "forward", "sampling", "prompt_logprobs"])
def test_a_failure_before_commit_changes_nothing(model, stage, monkeypatch):
    engine, _ = _mid_flight(model)
    before = _snapshot(engine)
    work = _work(engine)

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected failure in {stage}")
    if stage == "take_slots":
        monkeypatch.setattr(engine.scheduler, "take_slots", boom)
    elif stage == "forward":
        monkeypatch.setattr(engine.model, "forward", boom)
    elif stage == "sampling":
        # After the seeded sequence has drawn: the draw must be undone too.
        real = sampler.sample

        def sample_then_fail(*args, **kwargs):
            real(*args, **kwargs)
            raise RuntimeError("injected")
        monkeypatch.setattr(engine.runner, "greedy_tokens", lambda *a: None)
        monkeypatch.setattr(sampler, "sample", sample_then_fail)
        monkeypatch.setattr(model_runner, "prompt_logprobs", boom)
    else:
        monkeypatch.setattr(model_runner, "prompt_logprobs", boom)
    plan = None
    with pytest.raises(RuntimeError, match="injected"):
        plan = engine._prepare(work)
        engine._run(plan)
    if plan is not None:
        engine._abandon(plan)
    assert _snapshot(engine) == before


def test_a_poisoned_sequence_fails_alone_and_the_others_answer_as_if_alone(model, monkeypatch):
    """The issue's reproduction: a failure after some sequences were sampled. Before
    steps were transactions, a retried sequence emitted after finishing and another
    took a second KV slot for one token, silently corrupting its answer."""
    engine, seqs = _mid_flight(model)
    emitted = {s.id: [] for s in seqs}
    for s in seqs:
        s.on_output = lambda seq, out: emitted[seq.id].append(out)
    real = model_runner.prompt_logprobs
    calls = [0]

    def poisoned(row, logits):
        calls[0] += 1
        if calls[0] <= 2:  # the mixed step and the poisoned sequence's own retry
            raise RuntimeError("poisoned prompt")
        return real(row, logits)
    monkeypatch.setattr(model_runner, "prompt_logprobs", poisoned)
    writes: list[list[int]] = []
    forward = engine.model.forward

    def recording(batch, pool, **kw):
        out = forward(batch, pool, **kw)
        writes.append(batch.write_slots.tolist())
        return out
    monkeypatch.setattr(engine.model, "forward", recording)
    while engine.has_work():
        engine.step()
    assert seqs[2].finish_reason == "error" and "poisoned prompt" in seqs[2].error
    for s in seqs[:2]:
        assert s.finish_reason == "length" and len(s.output_ids) == 30
        outs = emitted[s.id]
        assert [o.token_id for o in outs] == s.output_ids[-len(outs):]   # each token emitted once
        assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
    assert engine.stats()["kv_used_tokens"] == 0 and engine.stats()["kv_reserved_tokens"] == 0
    assert len(engine.scheduler.free_slots) + engine.stats()["kv_cached_tokens"] == 512


def test_seeded_and_greedy_answers_survive_a_failed_step(model, monkeypatch):
    """The same answers as an engine where nothing failed: no token drawn twice, no
    generator draw lost, no duplicated key in any sequence's attention."""
    def run(fail: bool):
        engine = _engine(model)
        a = engine.add_request(_prompt(20, 1), SamplingParams(max_tokens=16, temperature=1.0, seed=7))
        b = engine.add_request(_prompt(12, 2), SamplingParams(max_tokens=16, temperature=0))
        steps = [0]
        real = engine.runner.greedy_tokens

        def flaky(*args):
            steps[0] += 1
            if fail and steps[0] in (3, 7):
                raise RuntimeError("transient failure")
            return real(*args)
        monkeypatch.setattr(engine.runner, "greedy_tokens", flaky)
        while engine.has_work():
            engine.step()
        return a, b, engine
    a0, b0, _ = run(False)
    a1, b1, engine = run(True)
    assert a1.output_ids == a0.output_ids and b1.output_ids == b0.output_ids
    assert a1.finish_reason == b1.finish_reason == "length"
    assert len(engine.scheduler.free_slots) + engine.stats()["kv_cached_tokens"] == 512


def test_a_client_told_of_the_end_finds_the_prompt_logprobs_in_place(model):
    """The server reads a sequence's prompt log-probabilities as soon as its last token says
    it ended (on its own thread): the commit stores them before it appends the tokens. A
    prompt of 40 tokens in 16-token chunks ends its prefill on its only output token."""
    seen = []

    def on_output(seq, out):
        if out.finished:
            seen.append(len(seq.input_logprobs))

    engine = _engine(model)
    prompt = _prompt(40, 9)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, logprobs=0, logprob_start_len=0),
                             on_output=on_output)
    while engine.has_work():
        engine.step()
    assert seen == [len(prompt)] and len(seq.input_logprobs) == len(prompt)


def test_commit_failure_of_one_client_fails_only_it(model):
    engine = _engine(model)
    good = engine.add_request(_prompt(10, 4), SamplingParams(max_tokens=6, temperature=0))

    def broken(seq, out):
        if out.token_id is not None:
            raise ConnectionError("client gone")
    bad = engine.add_request(_prompt(10, 5), SamplingParams(max_tokens=6, temperature=0), broken)
    while engine.has_work():
        engine.step()
    assert good.finish_reason == "length" and bad.finish_reason == "error" and "client gone" in bad.error
    assert engine.stats()["kv_used_tokens"] == 0


def test_infinite_logits_are_the_support_and_nan_fails_one_request():
    logits = torch.zeros(50)
    logits[[7, 31]] = float("inf")
    params = SamplingParams(temperature=0.8)
    drawn = {sampler.sample(logits, params, torch.Generator().manual_seed(s)).token for s in range(40)}
    assert drawn == {7, 31}
    assert sampler.sample(logits, SamplingParams(temperature=0), None).token == 7
    lp = sampler.sample(logits, SamplingParams(temperature=1.0, logprobs=2), torch.Generator().manual_seed(0))
    assert lp.logprob == pytest.approx(-0.6931, abs=1e-4)
    with pytest.raises(sampler.SamplingError, match="NaN"):
        sampler.sample(torch.tensor([0.0, float("nan")]), params, None)


def test_cached_kv_does_not_outlive_the_weights(model):
    """After load_state_dict (or invalidate_packed_weights / repack) a cached prompt
    is computed again with the new weights, also when a running request pinned it."""
    from rvascend.policy import invalidate_packed_weights

    local = load_model(ensure_random_model(), torch.float32)
    engine = _engine(local, chunked_prefill_size=512)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    prompt = _prompt(40, 6)
    engine.generate([prompt], params)
    assert engine.generate([prompt], params)[0].cached_tokens == 39
    running = engine.add_request(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.step()
    assert running.cached_tokens == 39 and running.status is Status.RUNNING
    state = {k: v * 1.5 if k.endswith("o_proj.weight") else v for k, v in local.state_dict().items()}
    local.load_state_dict(state)
    fresh = _engine(local, disable_radix_cache=True).generate([prompt], params)[0]
    after = engine.generate([prompt], params)[0]
    assert after.cached_tokens == 0 and after.output_ids == fresh.output_ids
    assert engine.stats()["cache_retirements"] == 1
    while engine.has_work():
        engine.step()
    assert engine.stats()["kv_used_tokens"] == 0
    assert len(engine.scheduler.free_slots) + engine.stats()["kv_cached_tokens"] == 512
    invalidate_packed_weights(local)
    assert engine.generate([prompt], params)[0].cached_tokens == 0
    assert engine.stats()["cache_retirements"] == 2


def test_a_request_waiting_for_a_shared_prefill_does_not_block_the_queue(model):
    engine = _engine(model)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    long = _prompt(96, 7)
    first = engine.add_request(long, params)
    engine.step()
    assert first.prefilling
    sharer = engine.add_request(long[:64] + _prompt(8, 8), params)
    unrelated = engine.add_request(_prompt(8, 9), params)
    engine.step()
    assert sharer.status is Status.WAITING and unrelated.status is Status.RUNNING
    while engine.has_work():
        engine.step()
    assert sharer.cached_tokens >= 64 and unrelated.finish_reason == "length"


def test_steps_from_two_threads_run_one_after_another(model):
    """`generate` beside another stepping thread (as beside the server's engine
    thread): the forward passes never overlap and the answers are a lone caller's."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [_prompt(9, 1), _prompt(5, 2)]
    want = [s.output_ids for s in _engine(model).generate(prompts, params)]
    engine = _engine(model)
    inside, most = [0], [0]

    def enter(module, args):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # a second stepping thread would enter the model meanwhile

    def leave(module, args, out):
        inside[0] -= 1
    hooks = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    try:
        results: list = [None, None]
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, engine.generate([prompts[i]], params)))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for h in hooks:
            h.remove()
    assert most[0] == 1
    assert [r[0].output_ids for r in results] == want
    assert all(r[0].finish_reason == "length" for r in results)


def test_flush_cache_during_a_step_is_refused_without_waiting(model):
    """The server calls flush_cache from its event loop: during a step it answers
    False at once (the step's requests are running), never waits for the step."""
    engine = _engine(model)
    answers: list = []

    def flush_from_another_thread(module, args):
        t = threading.Thread(target=lambda: answers.append(engine.flush_cache()))
        start = time.monotonic()
        t.start()
        t.join(timeout=5)
        answers.append(time.monotonic() - start)
    hook = model.register_forward_pre_hook(flush_from_another_thread)
    try:
        engine.generate([_prompt(6, 3)], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    finally:
        hook.remove()
    assert answers[0] is False and answers[1] < 1.0
    assert engine.flush_cache()  # idle: flushed


@pytest.mark.parametrize("when", ["last token", "first token", "every token"])
def test_a_callback_that_raises_leaks_nothing(model, when):
    """The server's callback raises once its event loop is closed. Raised on a
    sequence's last token (which has already marked it finished), it once left
    the sequence's slots, reservation and prefix-cache lock held for good."""
    engine = _engine(model, max_total_tokens=96)
    idle = {"free": len(engine.scheduler.free_slots), "reserved": 0}
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    def callback(seq, out):
        if when == "every token" or (when == "last token" and out.finished) or \
                (when == "first token" and len(seq.output_ids) == 1):
            raise RuntimeError("the event loop is closed")
    seqs = [engine.add_request(_prompt(24, i), params, callback) for i in range(3)]
    for _ in range(100):
        if not engine.has_work():
            break
        engine.step()
    assert all(s.status is Status.FINISHED for s in seqs)
    assert engine.scheduler.reserved == idle["reserved"] and engine.cache.locked_size == 0
    assert len(engine.scheduler.free_slots) + engine.cache.evictable_size == idle["free"]
    assert all(not s.slots and s.reserved == 0 and s.cache_node is None for s in seqs)
    # The pool is whole: a request that needs all of it is served.
    (seq,) = engine.generate([_prompt(40, 9)], SamplingParams(max_tokens=56, temperature=0, ignore_eos=True))
    assert len(seq.output_ids) == 56

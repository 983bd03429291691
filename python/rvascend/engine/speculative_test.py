"""Speculative decoding with n-gram drafts: the output is exactly what decoding without
drafts gives (greedy and seeded sampling, penalties, logprobs, stop strings, EOS and
max_tokens inside an accepted run), in fewer steps where the text repeats; rejected
drafts' slots go back; a failed step changes nothing; constrained requests draft within
their grammar. Hybrid models' verify steps: engine/qwen3_5_test.py."""

from __future__ import annotations

import re

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, Grammar, SamplingParams
from rvascend.engine import engine as engine_module
from rvascend.engine import model_runner
from rvascend.engine.testing import drafts_as_asked  # noqa: F401 - an autouse fixture
from rvascend.engine.ngram_draft import PAUSE_STEPS, DraftBudget, NgramIndex
from rvascend.models.random_model import ensure_random_model
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy
from rvascend.tokenizer.tokenizer import Tokenizer



REPEATING = [5, 6, 7, 8, 9, 10] * 6


def test_ngram_index_proposes_the_latest_longest_match():
    index = NgramIndex(1, 3)
    assert index.propose([1, 2, 3, 4, 9], [1, 2, 3], 3) == [4, 9, 1]
    assert index.propose([1, 2, 3, 4, 9], [1, 2, 3, 4], 2) == [9, 1]  # tokens appended since: indexed too
    assert index.tokens == [1, 2, 3, 4, 9, 1, 2, 3, 4]
    assert NgramIndex(2, 3).propose([5, 6, 7], [], 2) == []              # no earlier occurrence
    assert NgramIndex(1, 1).propose([1, 7], [1, 8, 1], 1) == [8]          # the most recent occurrence
    assert NgramIndex(1, 4).propose([3], [14, 14, 14], 4) == [14] * 4     # a run repeats as far as asked
    assert NgramIndex(2, 2).propose([1, 2, 1, 2], [], 5) == [1, 2, 1, 2, 1]
    assert NgramIndex(1, 3).propose([1, 2, 3], [], 0) == []


def test_the_budget_shrinks_pauses_and_probes_again():
    budget = DraftBudget(4)
    assert budget.next_k() == 1  # one at first, twice as many after a draft taken whole
    budget.record(1, 1)
    assert budget.next_k() == 2
    budget.record(2, 2)
    assert budget.next_k() == 4
    budget.record(4, 4)
    assert budget.next_k() == 4
    budget.record(4, 2)  # taken in part: as many as were taken
    assert budget.next_k() == 2
    budget.record(2, 2)
    for _ in range(3):
        budget.record(budget.next_k(), 0)
    assert budget.paused == PAUSE_STEPS
    assert [budget.next_k() for _ in range(PAUSE_STEPS)] == [0] * PAUSE_STEPS
    assert budget.next_k() >= 1  # probing again
    while not budget.paused:  # and failing again: a pause twice as long
        budget.record(1, 0)
    assert budget.paused == 2 * PAUSE_STEPS
    budget.paused = 0
    budget.record(2, 2)  # a draft taken in full: back to the shortest pause next time
    while not budget.paused:
        budget.record(1, 0)
    assert budget.paused == PAUSE_STEPS


@pytest.fixture(scope="module")
def model():
    m = load_model(ensure_random_model(), torch.bfloat16)
    install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    return m


def _generate(model, prompts, params, spec: bool, eos=None):
    # One-token matches too: more drafts, more of the exactness tested.
    engine = Engine(model, None, EngineConfig(max_total_tokens=4096, speculative_algorithm="NGRAM" if spec else None,
                                              speculative_ngram_min_match_window_size=1))
    if eos is not None:
        engine.eos_ids = {eos}
    outputs = [[] for _ in prompts]
    seqs = [engine.add_request(p, params, on_output=lambda s, o, i=i: outputs[i].append(o))
            for i, p in enumerate(prompts)]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    assert engine.stats()["kv_used_tokens"] == 0  # every slot, rejected drafts' too, went back
    done = [(s.output_ids, s.finish_reason, [(o.token_id, o.logprob, o.top_logprobs) for o in out])
            for s, out in zip(seqs, outputs)]
    return done, steps, engine.stats()


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=48, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
    SamplingParams(max_tokens=48, temperature=1.2, top_k=20, repetition_penalty=1.1, frequency_penalty=0.3, seed=8,
                   ignore_eos=True, logprobs=2),
], ids=["greedy", "top_p", "penalties"])
def test_the_output_is_exactly_decodings(model, params):
    prompts = [REPEATING, list(range(40, 90)), REPEATING[:20]]
    plain, plain_steps, _ = _generate(model, prompts, params, spec=False)
    spec, spec_steps, stats = _generate(model, prompts, params, spec=True)
    assert spec == plain
    assert stats["spec_drafted_tokens"] > 0
    if params.temperature == 0:  # the random model repeats itself: its drafts are taken
        assert stats["spec_accepted_tokens"] > 0 and spec_steps < plain_steps


def test_endings_inside_an_accepted_run(model):
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    (plain,), _, _ = _generate(model, [REPEATING], greedy, spec=False)
    tokens = plain[0]
    # max_tokens, a stop token and EOS landing inside a run of accepted drafts.
    for params in (SamplingParams(max_tokens=23, temperature=0, ignore_eos=True),
                   SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop_token_ids=(tokens[17],))):
        want, _, _ = _generate(model, [REPEATING], params, spec=False)
        got, _, _ = _generate(model, [REPEATING], params, spec=True)
        assert got == want and got[0][1] == want[0][1]
    params = SamplingParams(max_tokens=40, temperature=0)
    got = _generate(model, [REPEATING], params, spec=True, eos=tokens[19])[0]
    assert got == _generate(model, [REPEATING], params, spec=False, eos=tokens[19])[0] and got[0][1] == "stop"


def _verify_runs(monkeypatch) -> list[tuple[int, int]]:
    """Records (output tokens before the run, tokens drawn) of every verify row committed."""
    runs: list[tuple[int, int]] = []
    real = engine_module.Engine._commit

    def recording(self, plan):
        runs.extend((len(r.seq.output_ids), len(r.sampled)) for r in plan.rows if r.drafts)
        real(self, plan)

    monkeypatch.setattr(engine_module.Engine, "_commit", recording)
    return runs


@pytest.mark.parametrize("end", ["eos", "stop_token", "stop_string"])
def test_an_end_at_the_first_token_of_an_accepted_run(model, monkeypatch, end):
    """An end (EOS, a stop token, a stop string) on the first token of a run of two or more
    accepted drafts, prefix cache on. The sequence kept a K/V slot per drawn token, more
    slots than tokens, and the cache's insert failed: the engine failed every request and
    leaked the pool. Drafts here are the answer's own next tokens, so every run is taken whole;
    the end is put on the first token of each run in turn. The answer is decoding's, the same
    request again on the same engine (through the cache) answers the same, and every slot,
    reservation and lock is back."""
    tokenizer = Tokenizer(ensure_random_model())
    prompt = list(range(40, 90))
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    answer = _generate(model, [prompt], free, spec=False)[0][0][0]
    monkeypatch.setattr(NgramIndex, "propose", lambda self, p, output, k: answer[len(output):len(output) + k])
    runs = _verify_runs(monkeypatch)
    _generate(model, [prompt], free, spec=True)
    text = [tokenizer.decode(answer[:p]) for p in range(len(answer) + 1)]

    def ends_first_at(p: int) -> bool:
        if end != "stop_string":
            return answer[p] not in answer[:p]
        piece = text[p + 1][len(text[p]):]
        return text[p + 1].startswith(text[p]) and piece.strip() != "" and piece not in text[p]

    firsts = [p for p, drawn in runs if drawn >= 3 and p < len(answer) and ends_first_at(p)]
    assert firsts, (runs, answer)
    for p in firsts:
        engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=1024, speculative_algorithm="NGRAM"))
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=end != "eos",
                                stop_token_ids=(answer[p],) if end == "stop_token" else (),
                                stop=(text[p + 1][len(text[p]):],) if end == "stop_string" else ())
        if end == "eos":
            engine.eos_ids = {answer[p]}
        for _ in range(2):  # the second time, its prompt and answer come from the cache
            (seq,) = engine.generate([prompt], params)
            assert (seq.output_ids, seq.finish_reason, seq.error) == (answer[:p + 1], "stop", None)
            if end == "stop_string":
                assert seq.text == text[p]
            stats = engine.stats()
            assert (stats["kv_used_tokens"], stats["kv_reserved_tokens"], stats["kv_locked_tokens"]) == (0, 0, 0)
        assert engine.stats()["cache_hit_rate"] > 0.4


def test_a_failing_cache_insertion_fails_its_sequence_alone(model, monkeypatch):
    """The step-transaction rule holds past the forward pass: a sequence whose prefix-cache
    insertion raises (at the end of its prefill, or when it ends) fails alone with what it
    holds given back; the others in its steps finish with decoding's answers."""
    from rvascend.engine import prefix_cache

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [list(range(40, 60)), list(range(60, 90)), REPEATING]
    want = [o for o, _, _ in _generate(model, prompts, params, spec=False)[0]]
    real = prefix_cache.PrefixCache.insert

    def poisoned(self, tokens, slots, states=None):
        if tokens[:3] == prompts[1][:3]:
            raise RuntimeError("injected in the cache")
        return real(self, tokens, slots, states)

    monkeypatch.setattr(prefix_cache.PrefixCache, "insert", poisoned)
    for chunk in (None, 8):  # the poisoned prompt ends in its own step, or in a chunk beside decoding rows
        engine = Engine(model, None, EngineConfig(max_total_tokens=1024, chunked_prefill_size=chunk,
                                                  speculative_algorithm="NGRAM"))
        seqs = engine.generate(prompts, params)
        assert [s.output_ids for i, s in enumerate(seqs) if i != 1] == [w for i, w in enumerate(want) if i != 1]
        assert seqs[1].finish_reason == "error" and "injected in the cache" in seqs[1].error
        assert all(s.error is None for i, s in enumerate(seqs) if i != 1)
        stats = engine.stats()
        assert (stats["kv_used_tokens"], stats["kv_reserved_tokens"], stats["kv_locked_tokens"]) == (0, 0, 0)


def test_a_failed_verify_step_changes_nothing(model, monkeypatch):
    """A verify step that fails after its rows were drawn (1 + K slots taken) leaves the
    slots as they were, and the answer is the one no failure gives (each position draws
    with its own generator, so there is no generator state to undo)."""
    # top_k 1: sampled (the generator draws at every position) yet as repetitive as greedy,
    # so the drafts keep coming.
    params = SamplingParams(max_tokens=30, temperature=0.9, top_k=1, seed=5, ignore_eos=True)
    want = _generate(model, [REPEATING], params, spec=True)[0][0][0]
    engine = Engine(model, None, EngineConfig(max_total_tokens=4096, speculative_algorithm="NGRAM"))
    seq = engine.add_request(REPEATING, params)
    failures = 0

    def boom(*args, **kwargs):
        raise RuntimeError("injected after sampling")

    while engine.has_work():
        if seq.output_ids and failures < 3 and len(engine.speculator.draft(seq, engine._room(seq), engine.eos_ids)) >= 2:
            # Beside a prompt that asks for its log-probabilities: computed after the sampling.
            other = engine.add_request(list(range(3, 30)), SamplingParams(max_tokens=1, logprobs=0,
                                                                         logprob_start_len=0))
            with engine.scheduler.lock:
                engine.scheduler.admit()
            free = sorted(engine.scheduler.free_slots)
            plan = engine._prepare([(seq, 1 + len(seq.draft)), (other, len(other.prompt_ids))])
            real = model_runner.prompt_logprobs
            monkeypatch.setattr(model_runner, "prompt_logprobs", boom)
            with pytest.raises(RuntimeError, match="injected"):
                engine._run(plan)
            monkeypatch.setattr(model_runner, "prompt_logprobs", real)
            assert len(plan.rows[0].sampled) >= 1  # it had drawn
            engine._abandon(plan)
            assert sorted(engine.scheduler.free_slots) == free
            failures += 1
        engine.step()
    assert failures == 3 and seq.output_ids == want


def test_constrained_requests_draft_within_their_grammar(model):
    """Drafts under a grammar: cut to the prefix the grammar allows, each verified position
    sampled under the mask after the drafts before it; the output is decoding's, greedy and
    sampled. Before the grammar applies (after the reasoning), no drafts."""
    tokenizer = Tokenizer(ensure_random_model())
    grammar = Grammar("regex", "[ab]{6}(x[ab]{6}){4}")
    prompt = tokenizer.encode("abababx")
    outputs = {}
    for spec in (False, True):
        engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=1024, speculative_ngram_min_match_window_size=1,
                                                       speculative_algorithm="NGRAM" if spec else None))
        seqs = [engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=t, seed=3, grammar=grammar))
                for t in (0.0, 0.9)]
        while engine.has_work():
            engine.step()
        outputs[spec] = [s.output_ids for s in seqs]
        for s in seqs:
            assert re.fullmatch("[ab]{6}(x[ab]{6}){4}", tokenizer.decode(s.output_ids)), tokenizer.decode(s.output_ids)
    assert outputs[True] == outputs[False]
    assert engine.stats()["spec_accepted_tokens"] > 0
    seq = engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0, grammar=grammar,
                                                    grammar_after=(tokenizer.encode("x")[-1],)))
    with engine.scheduler.lock:
        engine.scheduler.admit()
    assert not seq.grammar_active and engine.speculator.draft(seq, engine._room(seq), engine.eos_ids) == []


@pytest.mark.parametrize("after_eos", ["eos", "text"])
def test_drafts_ending_in_eos_under_a_grammar(model, monkeypatch, after_eos):
    """A draft holding the grammar's last token and then EOS (as NEXTN drafts after a closing
    brace). llguidance's rollback does not count a consumed EOS, so feeding the drafted EOS to
    the matcher left it in error ("the grammar refused token ...") or one token behind (then
    its masks are wrong). The answer is decoding's, greedy and sampled; drafts past the EOS are
    cut; the matcher ends where decoding leaves it."""
    tokenizer = Tokenizer(ensure_random_model())
    pattern = "[a-c]{8}"
    prompt = tokenizer.encode("abcabcab")
    eos = tokenizer.eos_token_id
    results = {}
    for drafting in (False, True):
        engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=1024, speculative_algorithm="NGRAM"
                                                       if drafting else None))
        engine.eos_ids = {eos}
        outs = []
        for temperature in (0.0, 0.9):
            params = SamplingParams(max_tokens=16, temperature=temperature, seed=2, grammar=Grammar("regex", pattern))
            if drafting:  # the answer's own next tokens, EOS included, then more past it
                answer = results[temperature]
                tail = [eos, eos if after_eos == "eos" else answer[0]]
                future = answer + tail
                monkeypatch.setattr(NgramIndex, "propose",
                                    lambda self, p, output, k, f=future: f[len(output):len(output) + k])
            (seq,) = engine.generate([prompt], params)
            assert seq.error is None and seq.finish_reason == "stop", seq.error
            assert re.fullmatch(pattern, tokenizer.decode(seq.output_ids)), tokenizer.decode(seq.output_ids)
            if not drafting:
                results[temperature] = seq.output_ids
            outs.append(seq.output_ids)
        if drafting:
            assert outs == [results[0.0], results[0.9]]
            assert engine.stats()["spec_accepted_tokens"] > 0
            assert engine.stats()["kv_used_tokens"] == 0


def test_min_tokens_under_a_grammar_that_must_end(model):
    """min_tokens beyond what a grammar allows: where the mask leaves only EOS, the grammar
    wins (as it does over max_tokens) instead of a 500 naming llguidance's state, greedy and
    sampled."""
    tokenizer = Tokenizer(ensure_random_model())
    engine = Engine(model, tokenizer, EngineConfig(max_total_tokens=512))
    for temperature in (0.0, 0.9):
        (seq,) = engine.generate([tokenizer.encode("ab")], SamplingParams(
            max_tokens=12, min_tokens=8, temperature=temperature, seed=1, grammar=Grammar("regex", "[a-c]{2}")))
        assert seq.error is None and seq.finish_reason == "stop", seq.error
        assert re.fullmatch("[a-c]{2}", tokenizer.decode(seq.output_ids))


def test_bad_flags(model):
    with pytest.raises(ValueError, match="EAGLE"):
        Engine(model, None, EngineConfig(speculative_algorithm="EAGLE"))
    with pytest.raises(ValueError, match="1 to 16"):
        Engine(model, None, EngineConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=0))


def _chi_square_p_value_below(observed: list[int], expected: list[float]) -> float:
    """Pearson's statistic over cells with at least 5 expected (the rest pooled), and the
    normal deviate of its Wilson-Hilferty transform (large: the counts do not fit)."""
    cells, pooled_o, pooled_e = [], 0, 0.0
    for o, e in zip(observed, expected):
        if e >= 5:
            cells.append((o, e))
        else:
            pooled_o, pooled_e = pooled_o + o, pooled_e + e
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    k = len(cells) - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / (2 / (9 * k)) ** 0.5


def test_sampling_with_drafts_keeps_the_models_distribution(tmp_path, monkeypatch):
    """10,000 sampled answers of a 32-token model, every second token drafted: the second
    token's distribution and the third's after an accepted draft are the model's own
    (chi-square against the exact distributions, from the model's logits), with the
    speculative step's acceptance doing the drawing."""
    import json
    import os

    from safetensors.torch import save_file

    from rvascend.models import random_checkpoint
    from rvascend.models.random_model import random_weights
    from rvascend.models.testing import all_logits

    vocab, temperature, n = 32, 0.5, 10_000
    config = dict(random_checkpoint.SHAPES["smollm2-135m"], hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=vocab)
    with open(os.path.join(tmp_path, "config.json"), "w") as f:
        json.dump(config, f)
    weights = {k: v * 40 if k.endswith("proj.weight") or "embed" in k else v for k, v in random_weights(config, 3).items()}
    save_file(weights, os.path.join(tmp_path, "model.safetensors"))
    small = load_model(str(tmp_path), torch.float32)
    prompt = [1, 2, 3, 4, 5]

    def probs(ids):
        return torch.softmax(all_logits(small, torch.tensor(ids))[-1].double() / temperature, -1)

    p1 = probs(prompt)
    p2 = [probs(prompt + [a]) for a in range(vocab)]
    second = sum(p1[a] * p2[a] for a in range(vocab))
    draft = int(second.argmax())  # drafted after every first token: often accepted
    # The third token where the draft was taken, with "draft rejected" as one more cell.
    third = sum(p1[a] * p2[a][draft] * probs(prompt + [a, draft]) for a in range(vocab))
    monkeypatch.setattr(NgramIndex, "propose", lambda self, p, output, k: [draft] if len(output) == 1 else [])
    torch.manual_seed(11)
    engine = Engine(small, None, EngineConfig(max_total_tokens=8192, max_running_requests=64, max_queued_requests=n + 1,
                                              speculative_algorithm="NGRAM", speculative_num_draft_tokens=1,
                                              speculative_step_costs="none"))
    seqs = engine.generate([prompt] * n, SamplingParams(max_tokens=3, temperature=temperature, ignore_eos=True))
    assert engine.stats()["spec_drafted_tokens"] >= n * 0.9 and engine.stats()["spec_accepted_tokens"] > n * 0.1
    seconds = torch.bincount(torch.tensor([s.output_ids[1] for s in seqs]), minlength=vocab).tolist()
    assert _chi_square_p_value_below(seconds, (second * n).tolist()) < 3.29  # p > 0.0005
    thirds = torch.bincount(torch.tensor([s.output_ids[2] for s in seqs if s.output_ids[1] == draft]),
                            minlength=vocab).tolist()
    rejected = sum(1 for s in seqs if s.output_ids[1] != draft)
    expected = (third * n).tolist() + [float((1 - second[draft]) * n)]
    assert _chi_square_p_value_below(thirds + [rejected], expected) < 3.29
    # And the test can tell: the draft's own token counted as the answer would not fit.
    assert _chi_square_p_value_below([n if t == draft else 0 for t in range(vocab)], (second * n).tolist()) > 10

"""Constrained decoding in the engine: outputs match their grammar greedy and sampled,
beside unconstrained rows of the same step; a grammar applies after the tokens that end
the reasoning; a step that fails leaves every matcher where it was; a grammar llguidance
refuses is a RequestError naming the problem."""

from __future__ import annotations

import re

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, Grammar, GrammarError, RequestError, SamplingParams
from rvascend.engine import engine as engine_module
from rvascend.models.random_model import ensure_random_model
from rvascend.models.loader import load_model
from rvascend.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def engine():
    path = ensure_random_model()
    return Engine(load_model(path, torch.bfloat16), Tokenizer(path),
                  EngineConfig(max_total_tokens=1024, chunked_prefill_size=16))


def _run(engine, prompt: str, params: SamplingParams, n: int = 1):
    ids = engine.tokenizer.encode(prompt)
    return engine.generate([ids] * n, params)


def test_outputs_match_their_grammar_beside_free_rows(engine):
    regex = Grammar("regex", "[a-f]{2}[0-9]{3}")
    free = engine.add_request(engine.tokenizer.encode("free text"), SamplingParams(max_tokens=12, temperature=0))
    seqs = [engine.add_request(engine.tokenizer.encode(f"code {i}"),
                               SamplingParams(max_tokens=12, temperature=1.0, seed=i, grammar=regex))
            for i in range(4)]
    greedy = engine.add_request(engine.tokenizer.encode("code"), SamplingParams(max_tokens=12, temperature=0,
                                                                              grammar=regex))
    while engine.has_work():
        engine.step()
    for seq in seqs + [greedy]:
        assert re.fullmatch("[a-f]{2}[0-9]{3}", seq.text) and seq.finish_reason == "stop", seq.text
    assert len({s.text for s in seqs}) > 1  # sampled: the draws differ
    alone = _run(engine, "free text", SamplingParams(max_tokens=12, temperature=0))[0]
    assert free.output_ids == alone.output_ids  # a constrained neighbour changes nothing


def test_a_grammar_applies_after_the_reasoning_ends(engine):
    free = _run(engine, "think first", SamplingParams(max_tokens=6, temperature=0))[0]
    end = free.output_ids[0]  # stands in for "</think>": the first token it would say
    # A grammar that forbids that token, whatever it is: a sandboxed test writes the random
    # model afresh, and one such copy's first word here was "10" (one run in six).
    pattern = "[a-f]{3}" if engine.tokenizer.decode([end]).strip().isdigit() else "[0-9]{3}"
    params = SamplingParams(max_tokens=10, temperature=0, grammar=Grammar("regex", pattern), grammar_after=(end,))
    seq = _run(engine, "think first", params)[0]
    assert seq.output_ids[0] == end  # unconstrained until then: the grammar would have forbidden it
    assert re.fullmatch(pattern, engine.tokenizer.decode(seq.output_ids[1:])), seq.text


def test_a_failed_step_leaves_the_matcher_where_it_was(engine, monkeypatch):
    params = SamplingParams(max_tokens=8, temperature=0, grammar=Grammar("regex", "[a-c]{5}"))
    want = _run(engine, "retry", params)[0].text
    seq = engine.add_request(engine.tokenizer.encode("retry"), params)
    engine.step()
    engine.step()
    commit = engine_module.Engine._commit
    failed = []

    def fail_once(self, plan):
        if not failed:
            failed.append(True)
            raise RuntimeError("injected")
        return commit(self, plan)

    monkeypatch.setattr(engine_module.Engine, "_commit", fail_once)
    while engine.has_work():
        try:
            engine.step()
        except RuntimeError:
            pass
    assert failed and seq.text == want


def test_bad_grammars_are_named(engine):
    ids = engine.tokenizer.encode("x")
    with pytest.raises(RequestError, match="regex is not served"):
        engine.add_request(ids, SamplingParams(grammar=Grammar("regex", "(")))
    with pytest.raises(RequestError, match="json_schema is not served"):
        engine.add_request(ids, SamplingParams(grammar=Grammar.json_schema({"type": "frob"})))
    with pytest.raises(GrammarError, match="at most"):
        Grammar("regex", "a" * (200 * 1024))
    with pytest.raises(GrammarError, match="not one of"):
        Grammar("yaml", "")
    # No tokenizer, no grammar.
    bare = Engine(engine.model, None, EngineConfig(max_total_tokens=64))
    with pytest.raises(RequestError, match="needs the model's tokenizer"):
        bare.add_request(ids, SamplingParams(grammar=Grammar("json_object")))

"""STANDALONE speculative decoding (a draft model): the output is exactly the target's
without drafts (greedy, and seeded sampling) whatever the draft model is; a draft model
with the target's weights has its drafts accepted; its pool follows the target's slot
for slot, so a prompt served from the prefix cache drafts as well as a fresh one; lent
slots all come back; a draft model that cannot draft for the target is refused by name."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.sequence import Status
from rvascend.engine.draft_cost import StepCosts
from rvascend.models.random_model import ensure_random_model
from rvascend.engine.standalone_draft import check_tokenizers
from rvascend.models.testing import TINY_QWEN3_5, write_random_checkpoint
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy
from rvascend.tokenizer.tokenizer import Tokenizer

PROMPTS = [[3, 17, 99, 250, 4, 8], [7] * 5 + [300, 301, 302], list(range(40, 90))]
# A smaller Llama of the random model's vocabulary, other weights: drafts mostly rejected.
OTHER = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
         "tie_word_embeddings": True, "eos_token_id": 1}
# Drafts as the budgets ask, whatever they cost: these tests are about what drafting does
# (draft_cost_test.py: how many tokens the cost lets a sequence draft).
AS_ASKED = {"speculative_step_costs": "none"}


def _deterministic(path: str):
    model = load_model(path, torch.bfloat16)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    return model


@pytest.fixture(scope="module")
def target():
    return _deterministic(ensure_random_model())


@pytest.fixture(scope="module")
def twin():
    return _deterministic(ensure_random_model())  # the target's weights, loaded again


@pytest.fixture(scope="module")
def other():
    return _deterministic(write_random_checkpoint(OTHER))


def _run(target, draft, prompts, params, k=4):
    config = EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE" if draft else None,
                          speculative_num_draft_tokens=k, **AS_ASKED)
    engine = Engine(target, None, config, draft_model=draft)
    seqs = engine.generate(prompts, params)
    return engine, [s.output_ids for s in seqs]


@pytest.mark.parametrize("which", ["twin", "other"])
def test_greedy_output_is_the_targets(target, twin, other, which):
    draft = twin if which == "twin" else other
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    _, plain = _run(target, None, PROMPTS, params)
    engine, spec = _run(target, draft, PROMPTS, params)
    assert spec == plain
    spec_stats = engine.speculator
    assert spec_stats.drafted > 0
    if which == "twin":  # the target drafting for itself: every draft is the target's own choice
        assert spec_stats.accepted == spec_stats.drafted
    # Nothing lent or drafted is kept: once the requests are done and the prefix cache is
    # flushed, every slot of the pool is free.
    assert engine.flush_cache()
    assert sorted(engine.scheduler.free_slots) == list(range(2048))


@pytest.mark.parametrize("which", ["twin", "other"])
def test_seeded_sampling_draws_the_same(target, twin, other, which):
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    engine, spec = _run(target, twin if which == "twin" else other, PROMPTS, params)
    assert spec == _run(target, None, PROMPTS, params)[1]
    assert engine.speculator.drafted > 0
    if which == "twin":
        # Sampled drafts are drawn with the noise the target's draw meets at their position:
        # the target's own weights propose exactly what it then draws (argmax drafts would
        # be taken about as often as the argmax is drawn).
        assert engine.speculator.accepted == engine.speculator.drafted


def test_unseeded_sampling_drafts_are_taken_from_the_same_weights(target, twin):
    params = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    engine, spec = _run(target, twin, PROMPTS, params)
    assert engine.speculator.drafted > 0 and engine.speculator.accepted == engine.speculator.drafted
    assert len({tuple(s) for s in spec}) == len(PROMPTS)


def test_a_cached_prefix_drafts_as_well_as_a_fresh_one(target, twin):
    """The second request's prompt comes from the prefix cache: the draft's pool holds it too
    (written slot for slot when the first request ran), so its drafts are all taken."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE", **AS_ASKED),
                    draft_model=twin)
    prompt = list(range(100, 180))
    first = engine.generate([prompt], params)[0]
    before = (engine.speculator.drafted, engine.speculator.accepted)
    second = engine.generate([prompt + [5, 6]], params)[0]
    assert second.cached_tokens >= 64
    drafted, accepted = engine.speculator.drafted - before[0], engine.speculator.accepted - before[1]
    assert drafted > 0 and accepted == drafted
    assert first.output_ids == _run(target, None, [prompt], params)[1][0]


def test_a_draft_that_cannot_draft_is_refused(target):
    params = EngineConfig(max_total_tokens=256, speculative_algorithm="STANDALONE", **AS_ASKED)
    smaller_vocab = _deterministic(write_random_checkpoint(dict(OTHER, vocab_size=1024)))
    with pytest.raises(ValueError, match=r"vocabulary \(1024 tokens\) is not the target's \(2048\)"):
        Engine(target, None, params, draft_model=smaller_vocab)
    hybrid = load_model(write_random_checkpoint(dict(TINY_QWEN3_5, vocab_size=2048)), torch.float32)
    with pytest.raises(ValueError, match="recurrent layers"):
        Engine(target, None, params, draft_model=hybrid)
    with pytest.raises(ValueError, match="STANDALONE drafts with a draft model"):
        Engine(target, None, params)
    with pytest.raises(ValueError, match="give both or neither"):
        Engine(target, None, EngineConfig(max_total_tokens=256), draft_model=target)



def copy_tokenizer(dest, indent=None, rename=None) -> str:
    """The random model's tokenizer written again into `dest`: re-indented, and with one
    added token renamed (a token id whose text differs)."""
    source = ensure_random_model()
    os.makedirs(dest, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(source, name)) as f:
            data = json.load(f)
        if name == "tokenizer.json" and rename:
            for token in data["added_tokens"]:
                if token["content"] == rename[0]:
                    token["content"] = rename[1]
        with open(os.path.join(dest, name), "w") as f:
            json.dump(data, f, indent=indent if name == "tokenizer.json" else None)
    return str(dest)


def test_tokenizers_are_compared_as_data(tmp_path):
    """The same tokenizer written another way (re-indented, as a directory beside a GGUF's)
    drafts; one token's text changed is refused."""
    target = Tokenizer(ensure_random_model())
    same = Tokenizer(copy_tokenizer(tmp_path / "same", indent=7))
    assert same.tokenizer_json != target.tokenizer_json
    check_tokenizers(target, same, "same")
    other = Tokenizer(copy_tokenizer(tmp_path / "other", rename=("<|begin_of_text|>", "<|begin|>")))
    with pytest.raises(ValueError, match="tokenizer is not the target's"):
        check_tokenizers(target, other, "draft.gguf")


def test_a_full_pool_drafts_for_as_many_rows_as_it_can(target, twin):
    """With too few free slots for every row's drafts, the first rows draft (the pool is
    nearly full); the output stays the target's and every slot comes back."""
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    prompts = [list(range(10 * i, 10 * i + 60)) for i in range(4)]
    _, plain = _run(target, None, prompts, params)
    engine = Engine(target, None, EngineConfig(max_total_tokens=404, speculative_algorithm="STANDALONE", **AS_ASKED,
                                               disable_radix_cache=True), draft_model=twin)
    lend, asked = engine.scheduler.lend, []
    engine.scheduler.lend = lambda n: asked.append((n, len(got := lend(n)))) or got
    assert [s.output_ids for s in engine.generate(prompts, params)] == plain
    assert any(0 < given < n for n, given in asked)  # short, and still drafting
    assert engine.speculator.accepted == engine.speculator.drafted > 0
    assert sorted(engine.scheduler.free_slots) == list(range(404))


def test_a_failing_draft_model_fails_no_request(target, twin, monkeypatch):
    """Drafts are proposals: a draft model that raises leaves the step to decode without them."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    _, plain = _run(target, None, PROMPTS, params)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE", **AS_ASKED),
                    draft_model=twin)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("draft broken")
        return original(*args, **kwargs)

    original = engine.speculator.draft_model.draft
    monkeypatch.setattr(engine.speculator.draft_model, "draft", broken)
    assert [s.output_ids for s in engine.generate(PROMPTS, params)] == plain
    assert len(calls) > 3
    assert engine.flush_cache() and sorted(engine.scheduler.free_slots) == list(range(2048))


def _count_passes(engine):
    """Row counts of the draft model's passes, as they run."""
    model, passes = engine.speculator.draft_model, []
    run = model._pass
    model._pass = lambda batch, *rest: passes.append(int(batch.input_ids.shape[0])) or run(batch, *rest)
    return passes


def test_a_sequence_without_drafts_skips_the_passes_and_catches_up(target, twin):
    """While the cost gives no drafts the draft model runs nothing for a decoding sequence;
    the pass before it drafts again runs the positions it skipped, so the target's own
    weights drafting are still accepted every time (a pool missing them would not be)."""
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    _, plain = _run(target, None, PROMPTS, params)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE"),
                    draft_model=twin)
    passes, steps, quiet = _count_passes(engine), [], []

    def lengths(budgets, acceptance, caps, sequences, rows, behind):
        steps.append(len(passes))
        if 3 <= len(steps) < 9:  # six steps without drafts
            quiet.append(len(passes))
            return [0] * len(caps)
        return list(caps)
    engine.speculator.lengths = lengths
    assert [s.output_ids for s in engine.generate(PROMPTS, params)] == plain
    assert len(set(quiet)) == 1  # no pass ran while nobody drafted
    assert 0 < engine.speculator.accepted == engine.speculator.drafted
    assert engine.flush_cache() and sorted(engine.scheduler.free_slots) == list(range(2048))


def test_drafts_that_cannot_pay_are_not_made(target, twin):
    """A draft model costing as much as the target never pays: its sequences only probe,
    and the draft model's passes are the prompts' and the probes' alone."""
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    _, plain = _run(target, None, PROMPTS, params)
    flat = {r: 1.0 for r in range(1, 64)}
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE"),
                    draft_model=twin, step_costs=StepCosts(target=flat, draft=flat))
    passes = engine.speculator.draft_model.passes
    assert [s.output_ids for s in engine.generate(PROMPTS, params)] == plain
    # 60 tokens a sequence: probes at its first ask and after 32 more steps, of one draft (a
    # fresh budget's ask) and then at most two (the first taken whole), in one pass each.
    assert 0 < engine.speculator.drafted <= 3 * len(PROMPTS)
    assert sum(passes.values()) <= 1 + 3 * len(PROMPTS)  # the prompts (one step), then the probes


def test_a_cached_prefix_whose_writer_skipped_positions_is_caught_up(target, twin):
    """Turn 1 drafts nothing for its last tokens (the draft's pool never gets them); turn 2
    takes turn 1 from the prefix cache: the positions turn 1 skipped are run before turn 2
    drafts, so the target's own weights drafting are still accepted every time."""
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE"),
                    draft_model=twin)
    skip = {"on": False}
    engine.speculator.lengths = lambda budgets, acceptance, caps, *_: [0] * len(caps) if skip["on"] else list(caps)
    prompt = list(range(100, 180))
    first = engine.add_request(prompt, params)
    while first.status is not Status.FINISHED:
        skip["on"] = len(first.output_ids) >= 8
        engine.step()
    assert first.draft_synced < first.num_tokens - 20
    skip["on"] = False
    before = (engine.speculator.drafted, engine.speculator.accepted)
    second = engine.generate([prompt + first.output_ids + [5, 6]], params)[0]
    assert second.cached_tokens > first.draft_synced
    drafted, accepted = engine.speculator.drafted - before[0], engine.speculator.accepted - before[1]
    assert drafted > 0 and accepted == drafted


def test_a_prompt_whose_draft_pass_failed_is_caught_up(target, twin):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE",
                                               disable_radix_cache=True, **AS_ASKED), draft_model=twin)
    model, calls = engine.speculator.draft_model, []
    run = model._pass

    def fails_first(batch, *rest):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return run(batch, *rest)
    model._pass = fails_first
    seq = engine.generate([list(range(100, 180))], params)[0]
    assert seq.output_ids == _run(target, None, [list(range(100, 180))], params)[1][0]
    assert 0 < engine.speculator.accepted == engine.speculator.drafted


def test_catching_up_runs_a_chunk_a_step(target, twin):
    """A sequence left without drafts for 200 steps, then drafting: its skipped positions run
    at most chunked_prefill_size a pass, and it drafts once they have all run."""
    params = SamplingParams(max_tokens=260, temperature=0, ignore_eos=True)
    _, plain = _run(target, None, [list(range(100, 140))], params)
    engine = Engine(target, None, EngineConfig(max_total_tokens=2048, speculative_algorithm="STANDALONE",
                                               chunked_prefill_size=16), draft_model=twin)
    calls = []
    engine.speculator.lengths = lambda budgets, acceptance, caps, *_: \
        calls.append(1) or (list(caps) if len(calls) > 200 or len(calls) < 3 else [0] * len(caps))
    passes = engine.speculator.draft_model.passes
    assert [s.output_ids for s in engine.generate([list(range(100, 140))], params)] == plain
    assert max(passes) <= 16 + 1 + 4  # a chunk, or a decode row's kept tokens and its drawn one
    assert 0 < engine.speculator.accepted == engine.speculator.drafted

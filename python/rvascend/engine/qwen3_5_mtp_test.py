"""Qwen3.5's MTP head: loaded from a checkpoint's mtp.* tensors, its logits against a
reference built from transformers' Qwen3.5 layers, and NEXTN drafting in the engine (the
output is decoding's; the verify steps go through the delta-rule op's multi-token path)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_qwen3_5

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.testing import drafts_as_asked  # noqa: F401 - an autouse fixture
from rvascend.dispatch.route import ROUTE_ATTR
from rvascend.models.random_model import ensure_random_model
from rvascend.models.testing import wrong_in_most_steps
from rvascend.models.decoder import ForwardBatch, KVPool
from rvascend.models.loader import load_model
from rvascend.models.testing import MTP_FULL_LAYER, write_qwen3_5_mtp_checkpoint



VOCAB = 256
FULL = MTP_FULL_LAYER


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def checkpoint(request, tmp_path_factory):
    """(transformers' model, the MTP tensors, a checkpoint directory holding both), FP32."""
    path = str(tmp_path_factory.mktemp("qwen3_5_mtp"))
    hf, mtp = write_qwen3_5_mtp_checkpoint(path, VOCAB, tie=request.param)
    return hf, mtp, path


def _reference_mtp_logits(hf, mtp: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """Position i's MTP logits (for the token at i + 2) over tokens[:-1], from transformers'
    own layers: the target's final hidden states, its RMSNorm, decoder layer, rotary
    embedding and lm_head, and the checkpoint's MTP tensors."""
    config = hf.config
    layer = hf_qwen3_5.Qwen3_5DecoderLayer(config, FULL).eval()
    layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in mtp.items() if k.startswith("mtp.layers.0.")})
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = hf_qwen3_5.Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        norms[name].weight.data.copy_(mtp[f"mtp.{name}.weight"])
    with torch.no_grad():
        ids = torch.tensor([tokens])
        hidden = hf.model(ids[:, :-1]).last_hidden_state                   # positions 0 .. n - 2
        embedded = hf.model.embed_tokens(ids[:, 1:])                        # the token after each
        x = torch.cat((norms["pre_fc_norm_embedding"](embedded), norms["pre_fc_norm_hidden"](hidden)), -1)
        x = x @ mtp["mtp.fc.weight"].T
        positions = torch.arange(len(tokens) - 1)[None]
        out = layer(x, position_embeddings=hf.model.rotary_emb(x, positions), attention_mask=None,
                    position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        return hf.lm_head(norms["norm"](out))[0]


def test_the_mtp_head_matches_a_reference_from_transformers_layers(checkpoint):
    hf, mtp, path = checkpoint
    model = load_model(path, torch.float32, mtp=True)
    tokens = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(5)).tolist()
    want = _reference_mtp_logits(hf, mtp, tokens)
    n = len(tokens) - 1
    pool = KVPool(model.config, 64, torch.float32, extra_layers=1)
    slots = torch.arange(n)
    with torch.no_grad():
        hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
        batch = ForwardBatch(torch.tensor(tokens[1:]), torch.arange(n), [n], [0], [slots], slots)
        h = model.mtp(model.model.embed_tokens(batch.input_ids), hidden, model.rotary, batch, pool)
        got = model.lm_head(h) if isinstance(model.lm_head, torch.nn.Linear) else h @ model.lm_head.weight.T
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_head_is_loaded_only_when_asked_and_refused_where_absent(checkpoint, tmp_path):
    _, _, path = checkpoint
    assert load_model(path, torch.float32).mtp is None  # its tensors are not read
    model = load_model(path, torch.float32, mtp=True)
    assert model.mtp is not None and model.mtp.fc.weight.shape == (64, 128)
    with pytest.raises(ValueError, match="loaded without one"):
        Engine(load_model(path, torch.float32), None, EngineConfig(speculative_algorithm="NEXTN"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["mtp_num_hidden_layers"] = 0
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(path):
        if name != "config.json" and name != "mtp.safetensors":
            os.symlink(os.path.join(path, name), bare / name)
    (bare / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no MTP layer"):
        load_model(str(bare), torch.float32, mtp=True)
    with pytest.raises(ValueError, match="for Qwen3.5 checkpoints, not LlamaForCausalLM"):
        load_model(ensure_random_model(), torch.float32, mtp=True)


@pytest.mark.parametrize("k", [1, 3])
def test_nextn_output_is_decodings(checkpoint, k):
    """Greedy and seeded sampling, beside a chunked prompt: token for token what decoding
    gives; the head drafts every decode step; every K/V and state slot goes back."""
    _, _, path = checkpoint
    model = load_model(path, torch.float32, mtp=True)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (7, 12, 30)]
    config = EngineConfig(max_total_tokens=512, chunked_prefill_size=8)
    for params in (SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=4, ignore_eos=True)):
        outputs = {}
        for algorithm in (None, "NEXTN"):
            engine = Engine(model, None, dataclasses.replace(config, speculative_algorithm=algorithm,
                                                            speculative_num_draft_tokens=k))
            outputs[algorithm] = [s.output_ids for s in engine.generate(prompts, params)]
            assert engine.stats()["kv_used_tokens"] == 0
            assert engine.states_free == config.max_running_requests
        assert outputs["NEXTN"] == outputs[None]
        assert engine.stats()["spec_drafted_tokens"] > 0


def test_nextn_drafts_are_the_heads_over_the_whole_text_with_drafts_accepted(checkpoint, monkeypatch):
    """Every first draft the engine's head makes (its K/V built step by step: prompt chunks,
    verify steps with drafts accepted, lent slots for the further drafts) is the argmax a
    reference over the whole text gives at that position. The drafts the steps verify are
    replaced by the known answer with a position wrong in most steps, so that runs of them
    are accepted; the output stays decoding's."""
    from rvascend.engine import mtp_draft

    hf, mtp, path = checkpoint
    model = load_model(path, torch.float32, mtp=True)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 21)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    config = EngineConfig(max_total_tokens=512, chunked_prefill_size=8, speculative_num_draft_tokens=3)
    want = {tuple(s.prompt_ids): s.output_ids for s in Engine(model, None, config).generate(prompts, params)}
    made = []  # (prompt, hidden position, first draft)
    real = mtp_draft.draft

    def scripted(model_, pool, target, rows, k, *args):
        drafts = real(model_, pool, target, rows, k, *args)
        for row, d in zip(rows, drafts):
            if d is None:
                continue
            seq = row.seq
            made.append((tuple(seq.prompt_ids), int(target.positions[row.start + row.kept - 1]), d[0]))
            known = len(seq.output_ids) + (1 if seq.prefilled < len(seq.prompt_ids) else row.kept)
            d[:] = wrong_in_most_steps(want[tuple(seq.prompt_ids)], known, len(d), VOCAB) or d
        return drafts

    monkeypatch.setattr(mtp_draft, "draft", scripted)
    engine = Engine(model, None, dataclasses.replace(config, speculative_algorithm="NEXTN"))
    seqs = engine.generate(prompts, params)
    assert [s.output_ids for s in seqs] == [want[tuple(p)] for p in prompts]
    stats = engine.stats()
    assert stats["spec_accepted_tokens"] > 0
    for seq in seqs:
        text = seq.prompt_ids + seq.output_ids
        ref = _reference_mtp_logits(hf, mtp, text)
        mine = [(p, d) for prompt, p, d in made if prompt == tuple(seq.prompt_ids) and p < len(text) - 1]
        assert len(mine) >= 5
        for p, d in mine:
            assert ref[p].max() - ref[p][d] <= 1e-4, (p, d, int(ref[p].argmax()))


def test_nextn_ends_at_the_first_token_of_an_accepted_run(checkpoint, monkeypatch):
    """A stop token on the first token of a run of accepted NEXTN drafts: the answer is
    decoding's up to it, and every K/V slot and state slot is back (the verify row keeps the
    K/V and the states of the tokens it appended only). The drafts are the known answer,
    so every run is taken whole."""
    from rvascend.engine import mtp_draft

    _, _, path = checkpoint
    model = load_model(path, torch.float32, mtp=True)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(9)).tolist()
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    config = EngineConfig(max_total_tokens=256, speculative_num_draft_tokens=3)
    want = Engine(model, None, config).generate([prompt], params)[0].output_ids
    real = mtp_draft.draft

    def known(model_, pool, target, rows, k, *args):
        drafts = real(model_, pool, target, rows, k, *args)
        for row, d in zip(rows, drafts):
            if d is not None:
                done = len(row.seq.output_ids) + (1 if row.seq.prefilled < len(row.seq.prompt_ids) else row.kept)
                d[:] = want[done:done + len(d)] or d
        return drafts

    monkeypatch.setattr(mtp_draft, "draft", known)
    ends = [p for p in range(1, 12) if want[p] not in want[:p]]
    assert ends
    engine = Engine(model, None, dataclasses.replace(config, speculative_algorithm="NEXTN"))
    for p in ends:
        (seq,) = engine.generate([prompt], dataclasses.replace(params, stop_token_ids=(want[p],)))
        assert (seq.output_ids, seq.finish_reason) == (want[:p + 1], "stop")
        assert engine.stats()["kv_used_tokens"] == 0 and engine.states_free == config.max_running_requests
    assert engine.stats()["spec_accepted_tokens"] > 0


def test_a_draft_vocabulary_drafts_among_its_tokens_and_leaves_the_output(checkpoint, tmp_path):
    """restrict_draft_vocab: each draft is the argmax of the full head's logits over the
    subset (within the BF16 rounding of the logits: the same rows, another GEMM), the
    policy packs the subset's projection, and the output is decoding's. Bad token maps are
    refused by name."""
    from rvascend.models import qwen3_5_mtp
    from rvascend.policy import KernelPolicyConfig, install_kernel_policy

    _, _, path = checkpoint
    model = load_model(path, torch.bfloat16, mtp=True)
    hot = list(range(0, VOCAB, 3))
    token_map = tmp_path / "hot.json"
    token_map.write_text(json.dumps(hot))
    qwen3_5_mtp.restrict_draft_vocab(model, qwen3_5_mtp.read_token_map(str(token_map)))
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    assert ROUTE_ATTR in model.mtp.draft_head.__dict__  # routed to the packed kernels like any projection
    h = torch.randn(5, model.config.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        full = (h.float() @ model.lm_head.weight.float().T)[:, hot]
        logits, ids = model.mtp.draft_logits(model.lm_head, h)
        drafts = ids[logits.argmax(-1)].tolist()
    assert all(t in hot for t in drafts)
    for row, token in zip(full, drafts):  # the best of the subset, but for BF16 rounding
        assert row[hot.index(token)] >= row.max() - 0.01 * row.abs().max()
    prompts = [[5, 6, 7, 8, 9, 10, 11]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = []
    for algorithm in (None, "NEXTN"):
        engine = Engine(model, None, EngineConfig(max_total_tokens=256, speculative_algorithm=algorithm))
        outputs.append(engine.generate(prompts, params)[0].output_ids)
    assert outputs[0] == outputs[1] and engine.stats()["spec_drafted_tokens"] > 0
    for ids, message in (([3, 3], "repeated"), ([VOCAB], f"outside the model's vocabulary of {VOCAB}"),
                         ([], "distinct token ids")):
        with pytest.raises(ValueError, match=message):
            qwen3_5_mtp.restrict_draft_vocab(model, ids)
    token_map.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a JSON list"):
        qwen3_5_mtp.read_token_map(str(token_map))
    token_map.write_text('[1, 2.5]')
    with pytest.raises(ValueError, match="integer token ids"):
        qwen3_5_mtp.read_token_map(str(token_map))


def test_a_draft_pass_that_fails_gives_its_lent_slots_back(checkpoint, monkeypatch):
    """The head's further drafts run in K/V slots lent for the step: when the pass fails
    there, the step goes on without drafts (they are only proposals), every lent slot is
    back, and the request finishes with decoding's output."""
    from rvascend.models import qwen3_5_mtp

    _, _, path = checkpoint
    model = load_model(path, torch.float32, mtp=True)
    prompt, params = [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    want = Engine(model, None, EngineConfig(max_total_tokens=128)).generate([prompt], params)[0].output_ids
    engine = Engine(model, None, EngineConfig(max_total_tokens=128, speculative_algorithm="NEXTN",
                                              speculative_num_draft_tokens=3))
    seq = engine.add_request(prompt, params)
    engine.step()  # the prompt, and the head's first drafts
    free = sorted(engine.scheduler.free_slots)
    calls = []
    real = qwen3_5_mtp.MultiTokenPredictor.forward

    def failing_in_the_chain(self, *args):
        calls.append(1)
        if len(calls) == 2:  # the extend pass ran; the first further draft fails
            raise RuntimeError("injected in a lent slot's pass")
        return real(self, *args)

    monkeypatch.setattr(qwen3_5_mtp.MultiTokenPredictor, "forward", failing_in_the_chain)
    plan = engine._prepare([(seq, 1 + len(engine.speculator.draft(seq, engine._room(seq), engine.eos_ids)))])
    fresh = [slot for row in plan.rows for slot in row.fresh]
    engine._run(plan)  # the injected failure is logged, not raised
    assert len(calls) == 2 and all(row.next_draft == [] for row in plan.rows)  # not the last step's
    assert sorted(engine.scheduler.free_slots + fresh) == free  # the lent slots are back
    assert engine.stats()["spec_failed_draft_passes"] == 1
    engine._commit(plan)
    monkeypatch.undo()
    while engine.has_work():
        engine.step()
    assert seq.output_ids == want and engine.stats()["kv_used_tokens"] == 0

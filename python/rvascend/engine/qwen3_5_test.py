"""Qwen3.5 (Gated DeltaNet hybrid) against transformers' Qwen3_5ForCausalLM, and in the engine."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine import model_runner
from rvascend.engine.sequence import Status
from rvascend.models import qwen3_5
from rvascend.models.loader import load_model
from rvascend.models.state_pool import RecurrentStatePool
from rvascend.engine.testing import assert_fused_decode_matches_op_by_op, drafts_as_asked  # noqa: F401
from rvascend.models.testing import wrong_in_most_steps
from rvascend.models.testing import Runner, tiny_qwen3_5_config
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy
from rvascend.dispatch import shape_gate



VOCAB = 256


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request, tmp_path_factory):
    """(transformers' model, ours loaded from its checkpoint), FP32."""
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(tiny_qwen3_5_config(VOCAB, tie=request.param)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:  # norms (zero-centred ones at 0 would hide a missing "1 +"), dt_bias, A_log
                p.copy_(torch.randn_like(p) * 0.5)
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    path = str(tmp_path_factory.mktemp("qwen3_5"))
    hf.save_pretrained(path)
    return hf, load_model(path, torch.float32), path


def _hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunked_form", "recurrent_prompts"])
@pytest.mark.parametrize("chunk", [0, 5], ids=["whole_prompts", "chunked_prefill"])
def test_logits_match_transformers_through_prefill_and_32_decode_steps(pair, chunk, recurrent, monkeypatch):
    """Prompts in either form: the chunked matrix products, or the op's recurrence (riscv64's)."""
    monkeypatch.setattr(qwen3_5, "RECURRENT_PROMPTS", recurrent)
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (7, 13, 3)]
    runner = Runner(ours, len(prompts), chunk)
    tokens = [list(p) for p in prompts]
    # Prefill: whole prompts in one step, or chunks of `chunk` tokens over several steps.
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        rows = []
        for i, p in enumerate(prompts):
            if done[i] < len(p):
                n = len(p) - done[i] if not chunk else min(chunk, len(p) - done[i])
                rows.append((i, p[done[i]:done[i] + n], done[i]))
        logits = runner.step(rows)
        start = 0
        for i, new, prefix in rows:
            want = _hf_logits(hf, prompts[i][:prefix + len(new)])[prefix:]
            torch.testing.assert_close(logits[start:start + len(new)], want, rtol=1e-4, atol=1e-4)
            start += len(new)
            done[i] += len(new)
    # 32 decode steps of all three, each continuing its greedy tokens.
    last = [int(_hf_logits(hf, t)[-1].argmax()) for t in tokens]
    for _ in range(32):
        logits = runner.step([(i, [last[i]], len(tokens[i])) for i in range(len(tokens))])
        for i in range(len(tokens)):
            tokens[i].append(last[i])
            want = _hf_logits(hf, tokens[i])[-1]
            torch.testing.assert_close(logits[i], want, rtol=1e-4, atol=1e-4)
            last[i] = int(want.argmax())


# FP32: the native call and the torch ops sum in other orders; after four steps the logits
# (magnitude about 6) part by up to 2e-5, some 40 ulps: 5e-5 is that roundoff with headroom,
# while a wrong gate, norm or state slot moves them by 1e-2 or more.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-5), (torch.bfloat16, 3e-2)])
def test_the_one_call_decode_step_equals_the_torch_layer(pair, dtype, tol, monkeypatch):
    from rvascend.models import qwen3_5
    from rvascend.ops import recurrent_gated_delta_rule

    path = pair[2]
    model = load_model(path, dtype)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 2)]
    native, stepwise = Runner(model, 3, 0), Runner(model, 3, 0)
    for r in (native, stepwise):
        r.step([(i, p, 0) for i, p in enumerate(prompts)])
    calls = []
    real = recurrent_gated_delta_rule.deltanet_decode
    monkeypatch.setattr(recurrent_gated_delta_rule, "deltanet_decode", lambda *a: calls.append(1) or real(*a))
    lens = [len(p) for p in prompts]
    for step in range(4):
        rows = [(i, [(7 * step + i) % VOCAB], lens[i]) for i in range(3)]
        got = native.step(rows)
        with monkeypatch.context() as m:
            m.setattr(qwen3_5.GatedDeltaNet, "_one_native_call", lambda *a: False)
            want = stepwise.step(rows)
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        lens = [n + 1 for n in lens]
    assert len(calls) == 4 * 3  # every decode step, every DeltaNet layer
    for a, b in zip(native.pool.states.ssm + native.pool.states.conv,
                    stepwise.pool.states.ssm + stepwise.pool.states.conv):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_the_one_call_decode_step_refuses_bad_slots_and_dtypes(pair):
    from rvascend.ops.recurrent_gated_delta_rule import deltanet_decode

    model = pair[1]
    layer = model.model.layers[0].linear_attn
    states = RecurrentStatePool(model.config, 4, torch.float32)
    mixed, z, b, a = layer.in_proj(torch.randn(2, 64)).split(layer.split, dim=-1)
    args = (mixed, z, b, a, states.conv[0], layer.conv1d.weight[:, 0], layer.A_log, layer.dt_bias, layer.norm.weight,
            layer.norm.eps, states.ssm[0])
    with torch.no_grad():
        with pytest.raises(ValueError, match="outside the state pool of 4 slots"):
            deltanet_decode(*args, torch.tensor([1, 4]), layer.nk)
        with pytest.raises(ValueError, match="used by two sequences"):
            deltanet_decode(*args, torch.tensor([2, 2]), layer.nk)
        with pytest.raises(TypeError, match="conv_state is torch.bfloat16"):
            deltanet_decode(*args[:4], states.conv[0].bfloat16(), *args[5:], torch.tensor([0, 1]), layer.nk)
        with pytest.raises(ValueError, match="slots"):
            deltanet_decode(*args, torch.tensor([0, 1], dtype=torch.int32), layer.nk)
        # Prompts: the lengths must cover the tokens exactly, one slot per sequence.
        with pytest.raises(ValueError, match="add up to 3 tokens, not 2"):
            deltanet_decode(*args, torch.tensor([0, 1]), layer.nk, torch.tensor([2, 1]))
        with pytest.raises(ValueError, match="has length -1"):
            deltanet_decode(*args, torch.tensor([0, 1]), layer.nk, torch.tensor([3, -1]))
        with pytest.raises(ValueError, match=r"slots has shape \(2,\), expected contiguous int64 \[1\]"):
            deltanet_decode(*args, torch.tensor([0, 1]), layer.nk, torch.tensor([2]))
        before = states.ssm[0].clone()
        deltanet_decode(*args, torch.tensor([3]), layer.nk, torch.tensor([2]))  # one prompt of two tokens
        assert torch.equal(states.ssm[0][:3], before[:3]) and not torch.equal(states.ssm[0][3], before[3])


@pytest.mark.parametrize("lengths", [None, [3, 1]], ids=["decode", "prompts"])
def test_the_one_call_step_reads_one_slot_and_writes_another(pair, lengths):
    """Double-buffered states (read_slots): the output and the written slots' states equal
    an in-place step's on the same states, and the slots read are left as they were."""
    from rvascend.ops.recurrent_gated_delta_rule import deltanet_decode

    model = pair[1]
    layer = model.model.layers[0].linear_attn
    t = 2 if lengths is None else sum(lengths)
    lens = None if lengths is None else torch.tensor(lengths)
    g = torch.Generator().manual_seed(4)
    in_place, buffered = (RecurrentStatePool(model.config, 5, torch.float32) for _ in range(2))
    for pool in (in_place, buffered):
        for x in (pool.conv[0], pool.ssm[0]):
            x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(9)))
    before = [buffered.conv[0].clone(), buffered.ssm[0].clone()]
    with torch.no_grad():
        mixed, z, b, a = layer.in_proj(torch.randn(t, 64, generator=g)).split(layer.split, dim=-1)
        params = (layer.conv1d.weight[:, 0], layer.A_log, layer.dt_bias, layer.norm.weight, layer.norm.eps)
        want = deltanet_decode(mixed, z, b, a, in_place.conv[0], *params, in_place.ssm[0], torch.tensor([1, 3]),
                               layer.nk, lens)
        got = deltanet_decode(mixed, z, b, a, buffered.conv[0], *params, buffered.ssm[0], torch.tensor([4, 0]),
                              layer.nk, lens, torch.tensor([1, 3]))
    assert torch.equal(got, want)
    for new, old, ref in ((buffered.conv[0], before[0], in_place.conv[0]), (buffered.ssm[0], before[1], in_place.ssm[0])):
        assert torch.equal(new[[4, 0]], ref[[1, 3]])             # written where asked
        assert torch.equal(new[[1, 2, 3]], old[[1, 2, 3]])       # read slots and the rest untouched
        assert not torch.equal(new[[4, 0]], old[[4, 0]])


def test_the_one_call_step_keeps_each_verified_tokens_states_in_its_token_slot(pair):
    """A verify step (token_slots): the output equals the step without them, and token j's
    slot holds the states a step over tokens 0..j alone leaves, conv window and delta rule."""
    from rvascend.ops.recurrent_gated_delta_rule import deltanet_decode

    model = pair[1]
    layer = model.model.layers[0].linear_attn
    lengths = [3, 2]
    g = torch.Generator().manual_seed(6)
    pool = RecurrentStatePool(model.config, 9, torch.float32)
    for x in (pool.conv[0], pool.ssm[0]):
        x.copy_(torch.randn(x.shape, generator=g))
    params = (layer.conv1d.weight[:, 0], layer.A_log, layer.dt_bias, layer.norm.weight, layer.norm.eps)

    def run(pool, rows, slots, lens, reads, token_slots=None):
        return deltanet_decode(mixed[rows], z[rows], b[rows], a[rows], pool.conv[0], *params, pool.ssm[0],
                               torch.tensor(slots), layer.nk, torch.tensor(lens), torch.tensor(reads), token_slots)

    with torch.no_grad():
        mixed, z, b, a = layer.in_proj(torch.randn(5, 64, generator=g)).split(layer.split, dim=-1)
        before = [pool.conv[0].clone(), pool.ssm[0].clone()]
        plain = RecurrentStatePool(model.config, 9, torch.float32)
        plain.conv[0].copy_(before[0]), plain.ssm[0].copy_(before[1])
        want = run(plain, slice(0, 5), [2, 3], lengths, [0, 1])
        got = run(pool, slice(0, 5), [2, 3], lengths, [0, 1], torch.tensor([4, 5, -1, 6, -1]))
        assert torch.equal(got, want)
        for tensor, ref in zip((pool.conv[0], pool.ssm[0]), (plain.conv[0], plain.ssm[0])):
            assert torch.equal(tensor[[2, 3]], ref[[2, 3]])
        # Token j's slot: the states after tokens 0..j of its sequence, computed alone.
        for rows, read, slot in ((slice(0, 1), 0, 4), (slice(0, 2), 0, 5), (slice(3, 4), 1, 6)):
            alone = RecurrentStatePool(model.config, 9, torch.float32)
            alone.conv[0].copy_(before[0]), alone.ssm[0].copy_(before[1])
            run(alone, rows, [8], [rows.stop - rows.start], [read])
            assert torch.equal(pool.conv[0][slot], alone.conv[0][8]) and torch.equal(pool.ssm[0][slot], alone.ssm[0][8])
        assert torch.equal(pool.conv[0][[0, 1]], before[0][[0, 1]]) and torch.equal(pool.ssm[0][[0, 1]], before[1][[0, 1]])
        for token_slots, message in (([4, 5, 7, 6, -1], "is its sequence's last"),
                                     ([4, 4, -1, 6, -1], "already another token's or sequence's slot"),
                                     ([4, 2, -1, 6, -1], "already another token's or sequence's slot"),
                                     ([4, 0, -1, 6, -1], "read slot 0 of sequence 0 is a slot or token slot the step"),
                                     ([4, 9, -1, 6, -1], "outside the state pool of 9 slots")):
            with pytest.raises(ValueError, match=message):
                run(pool, slice(0, 5), [2, 3], lengths, [0, 1], torch.tensor(token_slots))
        with pytest.raises(ValueError, match="token_slots"):
            run(pool, slice(0, 5), [2, 3], lengths, [0, 1], torch.tensor([4, 5, -1, 6]))


def _scripted_drafts(want: dict, monkeypatch) -> None:
    """n-gram drafts replaced by the known answer with a position wrong in most steps, so
    that steps take all of a draft, part of it, or none."""
    from rvascend.engine.ngram_draft import NgramIndex

    def propose(self, prompt, output, k):
        return wrong_in_most_steps(want[tuple(prompt)], len(output), k, VOCAB)

    monkeypatch.setattr(NgramIndex, "propose", propose)


@pytest.mark.parametrize("native", [True, False], ids=["one_call", "torch_form"])
def test_speculative_verify_on_the_hybrid_model_equals_decoding(pair, native, monkeypatch):
    """Drafts verified through the DeltaNet layers' per-token state slots: greedy and seeded
    sampled outputs are decoding's token for token, drafts are taken (fewer steps), a
    chunked prompt beside the verify rows is undisturbed, and every state slot goes back."""
    _, ours, _ = pair
    if not native:
        monkeypatch.setattr(qwen3_5.GatedDeltaNet, "_one_native_call", lambda *args: False)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (7, 12, 30)]
    for params in (SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=16, temperature=0.9, top_k=1, seed=4, ignore_eos=True)):
        config = EngineConfig(max_total_tokens=512, chunked_prefill_size=8)
        runs = {}
        for spec in (False, True):
            engine = Engine(ours, None, dataclasses.replace(config, speculative_algorithm="NGRAM" if spec else None,
                                                            speculative_num_draft_tokens=3))
            seqs = [engine.add_request(p, params) for p in prompts]
            steps = 0
            while engine.has_work():
                engine.step()
                steps += 1
            runs[spec] = [s.output_ids for s in seqs], steps
            if not spec:
                _scripted_drafts({tuple(p): s.output_ids for p, s in zip(prompts, seqs)}, monkeypatch)
        # 2 + K each, and the prefix cache's snapshots.
        assert engine.states.num_slots == 5 * config.max_running_requests + config.max_mamba_cache_size
        assert runs[True][0] == runs[False][0]
        stats = engine.stats()
        assert stats["spec_accepted_tokens"] > 0 and stats["spec_accepted_tokens"] < stats["spec_drafted_tokens"]
        assert runs[True][1] < runs[False][1]
        assert engine.states_free == config.max_running_requests and stats["kv_used_tokens"] == 0


def test_a_failed_hybrid_verify_step_leaves_the_states_it_read(pair, monkeypatch):
    _, ours, _ = pair
    prompt = list(range(3, 14))
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    want = Engine(ours, None, EngineConfig(max_total_tokens=256)).generate([prompt], params)[0].output_ids
    _scripted_drafts({tuple(prompt): want}, monkeypatch)
    engine = Engine(ours, None, EngineConfig(max_total_tokens=256, speculative_algorithm="NGRAM",
                                             speculative_num_draft_tokens=3))
    seq = engine.add_request(prompt, params)
    engine.step()  # the prompt
    states = engine.states
    before = [x[seq.state_slot].clone() for x in (*states.conv, *states.ssm)]
    held = (seq.state_slot, list(seq.spare_state_slots))
    plan = engine._prepare([(seq, 1 + len(engine.speculator.draft(seq, engine._room(seq), engine.eos_ids)))])
    assert plan.batch.state_token_slots is not None
    monkeypatch.setattr(model_runner.sampler, "sample", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    monkeypatch.setattr(engine.runner, "greedy_tokens", lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        engine._run(plan)
    engine._abandon(plan)
    assert (seq.state_slot, seq.spare_state_slots) == held
    assert all(torch.equal(x[seq.state_slot], b) for x, b in zip((*states.conv, *states.ssm), before))
    monkeypatch.undo()
    _scripted_drafts({tuple(prompt): want}, monkeypatch)
    while engine.has_work():
        engine.step()
    assert seq.output_ids == want


def test_engine_greedy_equals_transformers_generate(pair):
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 4, 17)]
    engine = Engine(ours, None, EngineConfig(max_total_tokens=256, chunked_prefill_size=6))
    seqs = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    for prompt, seq in zip(prompts, seqs):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert seq.output_ids == want[0, len(prompt):].tolist()
    assert engine.states_free == engine.config.max_running_requests  # every state slot back


def _three(engine):
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    return [engine.add_request([1 + i, 2, 3, 4, 5 + i], params) for i in range(3)]


def test_engine_state_slots_never_leak_and_a_failed_step_is_undone(pair, monkeypatch):
    _, ours, _ = pair
    config = EngineConfig(max_total_tokens=256, max_running_requests=3)
    clean = Engine(ours, None, config)
    want = [s.output_ids for s in clean.generate([[1, 2, 3, 4, 5], [3, 2, 3, 4, 7]],
                                                 SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))]
    engine = Engine(ours, None, config)
    a, b, c = _three(engine)
    engine.step()
    engine.step()
    assert engine.states_free == engine.config.max_running_requests - 3
    engine.abort(b)
    engine.step()
    assert b.status is Status.FINISHED and b.finish_reason == "abort"
    assert engine.states_free == engine.config.max_running_requests - 2
    # A step of two sequences that fails in its last layer, after every DeltaNet layer before it
    # wrote their states: undone, then run one sequence at a time, so nothing is applied twice.
    target = ours.model.layers[3].linear_attn.out_proj
    original = target.forward
    failures = []

    def poisoned(x):
        if x.shape[0] > 1:
            failures.append(x.shape[0])
            raise RuntimeError("boom")
        return original(x)
    monkeypatch.setattr(target, "forward", poisoned)
    engine.step()
    monkeypatch.setattr(target, "forward", original)
    assert failures == [2] and a.status is Status.RUNNING and c.status is Status.RUNNING
    while engine.has_work():
        engine.step()
    assert [a.output_ids, c.output_ids] == want
    assert engine.states_free == engine.config.max_running_requests


def test_a_failing_sequence_gives_its_state_slot_back(pair, monkeypatch):
    _, ours, _ = pair
    engine = Engine(ours, None, EngineConfig(max_total_tokens=256, max_running_requests=3))
    seqs = _three(engine)
    engine.step()
    target = ours.model.layers[0].linear_attn.out_proj
    monkeypatch.setattr(target, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("always")))
    engine.step()
    assert all(s.status is Status.FINISHED and s.finish_reason == "error" for s in seqs)
    assert engine.states_free == engine.config.max_running_requests


def test_a_callback_raising_on_the_last_token_gives_the_state_slots_back(pair):
    _, ours, _ = pair
    engine = Engine(ours, None, EngineConfig(max_total_tokens=256, max_running_requests=2))

    def callback(seq, out):
        if out.finished:
            raise RuntimeError("the event loop is closed")
    for round_ in range(3):  # once the pairs leaked, the third round's admission raised IndexError
        seqs = [engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
                                   callback) for i in range(2)]
        for _ in range(50):  # bounded: leaked slots would leave the requests waiting for ever
            if engine.step() == 0 and not engine.has_work():
                break
        assert all(s.finish_reason == "length" for s in seqs), round_
        assert engine.states_free == engine.config.max_running_requests
        assert engine.stats()["kv_reserved_tokens"] == 0


@pytest.mark.parametrize("change,message", [
    ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim = 1 is not in"),
    ({"layer_types": ["linear_attention"] * 4}, "has no full_attention layer"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.3}},
     "gives 9.6 rotary dims"),
    ({"linear_num_key_heads": 0}, "linear_num_key_heads = 0"),
])
def test_hybrid_configs_that_cannot_serve_are_refused_at_load(change, message):
    """Each of these once loaded and failed later: a conv state of no inputs, a KV pool
    of zero bytes per token (a division by zero at start-up), a truncated rotary width."""
    from rvascend.models.config import ModelConfig
    raw = {**tiny_qwen3_5_config(VOCAB, True).to_dict(), **change}
    ModelConfig.from_dict(tiny_qwen3_5_config(VOCAB, True).to_dict())
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw)


def test_a_turn_served_from_the_prefix_cache_equals_transformers_generate(pair):
    """A second turn resumes after the first's recurrent-state snapshot (its prompt, answer
    and new tokens: only those are prefilled) and answers as transformers' generate over the
    whole conversation."""
    hf, ours, _ = pair
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, VOCAB, (21,), generator=g).tolist()
    engine = Engine(ours, None, EngineConfig(max_total_tokens=256, chunked_prefill_size=8, mamba_track_interval=8))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    (first,) = engine.generate([prompt], params)
    turn = prompt + first.output_ids + torch.randint(0, VOCAB, (5,), generator=g).tolist()
    (second,) = engine.generate([turn], params)
    assert second.cached_tokens == len(prompt) + len(first.output_ids) - 1
    with torch.no_grad():
        want = hf.generate(torch.tensor([turn]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert second.output_ids == want[0, len(turn):].tolist()
    assert engine.states_free == engine.config.max_running_requests and engine.stats()["kv_used_tokens"] == 0


def test_the_policy_packs_the_deltanet_projections_too(pair, monkeypatch):
    """BF16 with the policy on: every projection packed (the DeltaNet layers' in_proj and
    out_proj included) and the logits those of the unrouted BF16 model within BF16 rounding."""
    _, _, path = pair
    monkeypatch.setattr(shape_gate, "measured_packed_wins", lambda m, n, k: True)
    off, on, drop = (load_model(path, torch.bfloat16) for _ in range(3))
    report = install_kernel_policy(on, KernelPolicyConfig(compile_mode="eager", shape_gate="measured"))
    kinds = sorted({kind for _, kind, _ in report.packed})
    assert kinds == ["down_proj", "gate_up_proj", "in_proj", "lm_head", "o_proj", "out_proj", "qkv_proj"]
    # --cpu-kernels-drop-unpacked: the packed copies alone, the same logits bit for bit.
    install_kernel_policy(drop, KernelPolicyConfig(compile_mode="eager", shape_gate="measured", drop_unpacked=True))
    assert not any(n.endswith(("proj.weight", "in_proj_qkv.weight", "in_proj_z.weight")) for n, _ in
                   drop.named_parameters())
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (6, 11)]
    runs = []
    for model in (off, on, drop):
        runner = Runner(model, 2, 0)
        logits = [runner.step([(i, p, 0) for i, p in enumerate(prompts)])]
        for step in range(4):
            logits.append(runner.step([(i, [7 + step], len(p) + step) for i, p in enumerate(prompts)]))
        runs.append(torch.cat(logits).float())
    scale = runs[0].abs().max()
    assert (runs[1] - runs[0]).abs().max() <= 0.03 * scale
    assert torch.equal(runs[2], runs[1])
    counters = get_policy(on).counters
    assert counters.calls("in_proj", "packed") == 5 * 3 and counters.calls("out_proj", "packed") == 5 * 3
    # The zero-centred norms run the elementwise kernels: per step the first layer's input
    # norm; the other 7 and the final norm add a residual; the one attention layer's q and k
    # norms go with the partial RoPE (rope kernel, zero-centred).
    kernels = get_policy(on).kernels.counters
    assert kernels.calls("rms_norm", "kernel") == 5 * 1 and kernels.calls("add_rms_norm", "kernel") == 5 * 8
    assert kernels.calls("rope", "kernel") == 5  # one routed call per layer and step covers q and k
    assert kernels.calls("sigmoid_mul", "kernel") == 5 and kernels.calls("sigmoid_mul", "fallback") == 0
    assert kernels.calls("rms_norm", "fallback") == kernels.calls("add_rms_norm", "fallback") == 0
    assert kernels.calls("rope", "fallback") == 0


def _policy_model(path: str, monkeypatch):
    """A BF16 Qwen3.5 with every projection packed (the measured gate told to pack all)."""
    monkeypatch.setattr(shape_gate, "measured_packed_wins", lambda m, n, k: True)
    m = load_model(path, torch.bfloat16)
    install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", shape_gate="measured"))
    return m


@pytest.mark.parametrize("sequences", [1, 3])
def test_the_fused_decode_step_is_bit_identical_to_module_by_module(pair, sequences, monkeypatch):
    """Both layer kinds in one native call (gated attention, Gated DeltaNet on the state
    slots): over 6 decode steps the logits, the K/V pool, the conv and delta-rule states
    are bit for bit the op-by-op path's, and the route counts are the same."""
    _, _, path = pair
    m = _policy_model(path, monkeypatch)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 12, 8)[:sequences]]
    assert_fused_decode_matches_op_by_op(m, prompts, 6, VOCAB)


def test_the_fused_step_refuses_a_bad_state_slot_before_anything_is_written(pair, monkeypatch):
    _, _, path = pair
    m = _policy_model(path, monkeypatch)
    runner = Runner(m, 2, 0)
    assert runner.pool.states.num_slots == 6
    runner.step([(0, [1, 2, 3], 0), (1, [4, 5], 0)])
    assert (runner.state_slots, runner.next_state_slots) == ([3, 2], [5, 4])
    for written, read, message in (
            ([6, 4], [3, 2], "slot 6 of sequence 0 is outside the state pool of 6 slots"),
            ([5, 5], [3, 2], "slot 5 is used by two sequences"),
            ([5, 4], [3, 7], "read slot 7 of sequence 1 is outside the state pool of 6 slots"),
            ([5, 4], [3, 5], "read slot 5 of sequence 1 is a slot or token slot the step writes")):
        runner.next_state_slots, runner.state_slots = written, read
        pool = runner.pool
        tensors = [*pool.k, *pool.v, *pool.states.conv, *pool.states.ssm]
        before = [t.clone() for t in tensors]
        with pytest.raises(ValueError, match=message):
            runner.step([(0, [6], 3), (1, [7], 2)])
        assert all(torch.equal(a, b) for a, b in zip(before, tensors))
    # Two sequences may read one slot (requests resuming from one cached snapshot): the same
    # token after the same states leaves the first layer (DeltaNet: no attention before it)
    # the same states in each one's slot, and the slot read is left as it was.
    runner.next_state_slots, runner.state_slots = [5, 4], [3, 3]
    states = runner.pool.states
    read = (states.conv[0][3].clone(), states.ssm[0][3].clone())
    runner.step([(0, [6], 3), (1, [6], 2)])
    assert torch.equal(states.conv[0][5], states.conv[0][4]) and torch.equal(states.ssm[0][5], states.ssm[0][4])
    assert torch.equal(states.conv[0][3], read[0]) and torch.equal(states.ssm[0][3], read[1])
    assert not torch.equal(states.ssm[0][5], read[1])


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_an_image_text_checkpoint_serves_its_text_model(tmp_path, tie):
    """Qwen3.5 as published (Qwen3_5ForConditionalGeneration: text_config, weights under
    model.language_model, a vision tower): the text model loads, the vision tower is never
    read, and the logits of a text prompt and 4 decode steps equal transformers' image-text
    model's (whose text positions are one position on all three rotary axes)."""
    text = tiny_qwen3_5_config(VOCAB, tie=tie)
    vision = transformers.Qwen3_5VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                              out_hidden_size=text.hidden_size, num_position_embeddings=16)
    config = transformers.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                        tie_word_embeddings=tie)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    hf.save_pretrained(str(tmp_path))
    ours = load_model(str(tmp_path), torch.float32)
    assert ours.config.multimodal_source == "Qwen3_5ForConditionalGeneration"
    assert ours.config.tie_word_embeddings == tie and not any("visual" in n for n, _ in ours.named_parameters())
    tokens = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = Runner(ours, 1, 0)
    logits = runner.step([(0, tokens, 0)])
    for step in range(5):
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([tokens])).logits[0]
        got = logits if step == 0 else logits[-1:]
        torch.testing.assert_close(got, want if step == 0 else want[-1:], rtol=1e-4, atol=1e-4)
        nxt = int(want[-1].argmax())
        logits = runner.step([(0, [nxt], len(tokens))])
        tokens.append(nxt)


def test_an_image_text_config_without_a_text_config_is_refused(tmp_path):
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"architectures": ["Qwen3_5ForConditionalGeneration"], "vision_config": {}}, f)
    with pytest.raises(ValueError, match="has no text_config object"):
        load_model(str(tmp_path))

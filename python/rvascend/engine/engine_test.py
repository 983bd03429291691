"""The engine against Hugging Face transformers' own models on the same checkpoints.

Tiny random checkpoints of all three families are written with
`save_pretrained` and read back by both. BF16 logits must agree within BF16
noise; greedy tokens must agree exactly in FP32, and in BF16 wherever the
reference's choice is not a near tie. All of it with and without the policy.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import transformers

from rvascend.ops import attention_kernel_has_block_form
from rvascend.engine import Engine, EngineConfig, QueueFullError, RequestError, SamplingParams
from rvascend.models.loader import load_model
from rvascend.engine.testing import greedy
from rvascend.models.testing import all_logits
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy
from rvascend.dispatch import kernel_routes

COMMON = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=4, vocab_size=2048, max_position_embeddings=256, initializer_range=0.05)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=False),
}
EAGER = KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed")  # its routes on any host (M = 2 packed)
PROMPT = 20


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp(request.param))
    transformers.AutoModelForCausalLM.from_config(FAMILIES[request.param]()).save_pretrained(path)
    return request.param, path


def _hf(path: str, dtype: torch.dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _ours(path: str, dtype: torch.dtype, policy: bool):
    model = load_model(path, dtype)
    if policy:
        install_kernel_policy(model, EAGER)
    return model


def _prompt() -> torch.Tensor:
    return torch.randint(0, 2048, (PROMPT,), generator=torch.Generator().manual_seed(1))


def test_kv_slot_tensor_follows_the_slot_list():
    """The per-step slot tensor is a mirror of seq.slots + the step's fresh slots, through
    extends, buffer growth, a new list (prefix-cache insert, admission) and a cleared one."""
    from rvascend.engine.sequence import Sequence

    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=4))
    for fresh in ([5, 6, 7], [9], [], list(range(100, 190))):
        assert seq.kv_slot_tensor(fresh).tolist() == seq.slots + fresh
        seq.slots.extend(fresh)
    assert seq.kv_slot_tensor([1]).tolist() == seq.slots + [1]   # the fresh slot is not kept
    seq.slots = [40, 41] + seq.slots[2:]                          # reassigned, same length
    assert seq.kv_slot_tensor([2]).tolist() == seq.slots + [2]
    seq.slots = [3]
    assert seq.kv_slot_tensor([4, 5]).tolist() == [3, 4, 5]
    seq.slots = []
    assert seq.kv_slot_tensor([8]).tolist() == [8]


@pytest.mark.parametrize("policy", ["off", "on", "on, past the row kernels' prefill keys"])
def test_bf16_logits_match_transformers(checkpoint, policy, monkeypatch):
    long_prefill = policy.startswith("on, past")
    if long_prefill:
        monkeypatch.setattr(kernel_routes, "ROW_KERNEL_PREFILL_KEYS", PROMPT - 1)
    family, path = checkpoint
    ids = _prompt()
    with torch.no_grad():
        want = _hf(path, torch.bfloat16)(ids[None]).logits[0].float()
    model = _ours(path, torch.bfloat16, policy != "off")
    got = all_logits(model, ids)
    assert (got - want).abs().max().item() <= 0.03 * want.abs().max().item()
    if policy != "off":
        assert get_policy(model).counters.calls(route="packed") > 0
        kernels = get_policy(model).kernels.counters
        layers = model.config.num_hidden_layers
        if long_prefill and not attention_kernel_has_block_form():
            # Past ROW_KERNEL_PREFILL_KEYS keys a set without a block form (x86's) leaves a prefill to SDPA.
            assert kernels.calls("kv_pool_attention", "fallback", "long_prefill_without_block_kernel") == layers
        else:
            # A short prompt, or a set with a block form (RVV's): the kernel takes the rows.
            assert kernels.calls("kv_pool_attention", "kernel") == layers
        assert kernels.calls("rope", "kernel") == layers
        assert kernels.calls("silu_mul", "kernel") == layers
        # First layer's input norm has no residual yet; every other norm fuses the add.
        assert kernels.calls("rms_norm", "kernel") == 1 and kernels.calls("add_rms_norm", "kernel") == 2 * layers
        # The prompt's layers run in one native call where op by op would take the same kernels:
        # not with qwen2's q/k/v bias (qkv_proj stays row-major), nor where its attention goes to SDPA.
        sdpa = long_prefill and not attention_kernel_has_block_form()
        fused = 0 if family == "qwen2" or sdpa else 1
        assert kernels.calls("decoder_layers", "kernel") == fused
        assert kernels.calls("decoder_layers", "fallback") == 1 - fused
        assert kernels.calls(route="fallback") == kernels.calls("kv_pool_attention", "fallback") + 1 - fused


def test_torch_attention_takes_sdpas_flash_kernel(checkpoint):
    """Policy off (and prompts the attention kernel leaves to torch): SDPA is called with four
    dimensions, which its flash kernel takes; with three it ran its math path, 2-4.5x slower."""
    _, path = checkpoint
    model = _ours(path, torch.bfloat16, False)
    with torch.profiler.profile() as prof:
        all_logits(model, _prompt())
    names = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert "aten::_scaled_dot_product_attention_math" not in names


def test_fp32_greedy_tokens_match_transformers(checkpoint):
    _, path = checkpoint
    ids = _prompt()
    with torch.no_grad():
        want = _hf(path, torch.float32).generate(ids[None], max_new_tokens=12, do_sample=False)[0, PROMPT:].tolist()
    assert greedy(_ours(path, torch.float32, False), ids, 12) == want


@pytest.mark.parametrize("policy", [False, True])
def test_bf16_greedy_tokens_match_transformers_away_from_ties(checkpoint, policy):
    _, path = checkpoint
    ids = _prompt()
    hf = _hf(path, torch.bfloat16)
    with torch.no_grad():
        want = hf.generate(ids[None], max_new_tokens=12, do_sample=False)[0, PROMPT:].tolist()
        # The reference's logits along its own continuation: where its top two
        # are within BF16 noise the choice is a coin toss for any implementation.
        ref = hf(torch.tensor([ids.tolist() + want[:-1]])).logits[0, PROMPT - 1:].float()
    top2 = ref.topk(2, dim=-1).values
    clear = ((top2[:, 0] - top2[:, 1]) > 0.05 * ref.abs().max()).tolist()
    got = greedy(_ours(path, torch.bfloat16, policy), ids, 12)
    agreed = 0
    for g, w, ok in zip(got, want, clear):
        if not ok:
            break
        assert g == w
        agreed += 1
    assert agreed >= 1 or not clear[0]


def test_continuous_batching_gives_m2_and_same_tokens(checkpoint):
    family, path = checkpoint
    model = _ours(path, torch.bfloat16, True)
    a, b = _prompt().tolist(), _prompt().flip(0).tolist()
    alone = [greedy(model, p, 6) for p in (a, b)]
    policy = get_policy(model)
    policy.counters.reset()
    policy.kernels.counters.reset()
    engine = Engine(model, None, EngineConfig(max_total_tokens=128))
    seqs = engine.generate([a, b], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert [s.output_ids for s in seqs] == alone
    assert policy.counters.rows_seen("o_proj", "packed").get(2, 0) > 0
    assert policy.counters.rows_seen("lm_head", "packed").get(2, 0) > 0
    # Both sequences' decode rows go through the pool attention kernel in one call per layer.
    assert policy.kernels.counters.rows_seen("kv_pool_attention", "kernel").get(2, 0) > 0
    if family == "qwen2":  # q/k/v bias: the gate sends qkv_proj to F.linear
        assert policy.counters.calls("qkv_proj", "fallback", "bias") > 0
        assert policy.counters.calls("qkv_proj", "packed") == 0
    else:
        assert policy.counters.rows_seen("qkv_proj", "packed").get(2, 0) > 0


def test_chunked_prefill_gives_the_same_tokens(checkpoint):
    _, path = checkpoint
    model = _ours(path, torch.float32, False)
    prompts = [torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (150, 37)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    runs = {}
    for size in (None, 32, 7):
        engine = Engine(model, None, EngineConfig(max_total_tokens=256, chunked_prefill_size=size))
        runs[size] = [s.output_ids for s in engine.generate(prompts, params)]
        assert engine.stats()["kv_used_tokens"] == 0 and engine.stats()["kv_reserved_tokens"] == 0
    assert runs[32] == runs[None] and runs[7] == runs[None]


def _steps_until_first_token(engine: Engine, waiting, running) -> int:
    """Decode tokens `running` gets while `waiting` is prefilled (until its first token)."""
    before = len(running.output_ids)
    while not waiting.output_ids:
        engine.step()
    return len(running.output_ids) - before


@pytest.mark.parametrize("size,gained", [(16, 7), (None, 1)])
def test_chunked_prefill_rides_along_with_decoding(size, gained):
    from rvascend.models.random_model import ensure_random_model
    model = load_model(ensure_random_model())
    engine = Engine(model, None, EngineConfig(max_total_tokens=512, chunked_prefill_size=size))
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    short = engine.add_request([1, 2, 3], params)
    engine.step()
    assert short.output_ids  # decoding now
    long = engine.add_request(list(range(10, 110)), params)
    # 100 prompt tokens in chunks of 16: 7 steps, each also decoding the short request.
    # Unchunked: one step with the whole prompt.
    assert _steps_until_first_token(engine, long, short) == gained
    while engine.has_work():
        engine.step()
    assert engine.stats()["kv_used_tokens"] == 0


def test_a_poisoned_prompt_in_a_mixed_step_fails_alone():
    """A new prompt whose forward raises rides in the same step as a running request's
    decode: only the prompt fails; the running request's tokens are as without it."""
    from rvascend.models.random_model import ensure_random_model
    model = load_model(ensure_random_model())
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    want = greedy(model, [5, 6, 7], 10)
    forward = model.forward

    def poisoned(batch, pool, **kwargs):
        if 1999 in batch.input_ids.tolist():
            raise RuntimeError("poisoned batch")
        return forward(batch, pool, **kwargs)
    model.forward = poisoned
    engine = Engine(model, None, EngineConfig(max_total_tokens=256))
    running = engine.add_request([5, 6, 7], params)
    engine.step()
    bad = engine.add_request([1999, 3], params)
    engine.step()
    assert bad.finish_reason == "error" and "poisoned batch" in bad.error
    assert len(running.output_ids) == 2 and running.finish_reason is None
    while engine.has_work():
        engine.step()
    assert running.output_ids == want and running.finish_reason == "length"
    assert engine.stats()["kv_used_tokens"] == 0 and engine.stats()["kv_reserved_tokens"] == 0


def test_abort_during_chunked_prefill_frees_its_slots():
    from rvascend.models.random_model import ensure_random_model
    engine = Engine(load_model(ensure_random_model()), None, EngineConfig(max_total_tokens=512, chunked_prefill_size=16))
    long = engine.add_request(list(range(10, 110)), SamplingParams(max_tokens=4))
    engine.step()
    engine.step()
    assert long.prefilled == 32 and engine.stats()["kv_used_tokens"] == 32 and not long.output_ids
    engine.abort(long)
    engine.step()
    assert long.finish_reason == "abort"
    assert engine.stats()["kv_used_tokens"] == 0 and engine.stats()["kv_reserved_tokens"] == 0


def _random_prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefix_cache_gives_the_same_tokens_and_reuses_the_prefix(checkpoint):
    """A system prompt shared by several requests and a chat's second turn (which
    extends the first turn's prompt and answer): the same greedy tokens as without
    the cache, exactly in FP32, chunked or not, with the prefix taken from the cache."""
    _, path = checkpoint
    model = _ours(path, torch.float32, False)
    system = _random_prompt(60, 7)
    questions = [system + _random_prompt(n, n) for n in (5, 11, 3)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for size in (None, 16):
        plain = Engine(model, None, EngineConfig(max_total_tokens=512, chunked_prefill_size=size,
                                                 disable_radix_cache=True))
        cached = Engine(model, None, EngineConfig(max_total_tokens=512, chunked_prefill_size=size))
        first_plain = plain.generate(questions[:1], params)[0]
        first = cached.generate(questions[:1], params)[0]
        assert first.output_ids == first_plain.output_ids and first.cached_tokens == 0
        rest = cached.generate(questions[1:], params)
        assert [s.output_ids for s in rest] == [s.output_ids for s in plain.generate(questions[1:], params)]
        assert all(s.cached_tokens == len(system) for s in rest)
        turn2 = questions[0] + first.output_ids + _random_prompt(4, 99)
        again = cached.generate([turn2], params)[0]
        assert again.output_ids == plain.generate([turn2], params)[0].output_ids
        # The first turn's prompt and all but its last answer token (never run) were cached.
        assert again.cached_tokens == len(questions[0]) + len(first.output_ids) - 1
        stats = cached.stats()
        assert stats["kv_used_tokens"] == 0 and stats["kv_reserved_tokens"] == 0 and stats["kv_cached_tokens"] > 0
        assert 0 < stats["cache_hit_rate"] < 1
        assert plain.stats()["kv_cached_tokens"] == 0


def _random_engine(**config) -> Engine:
    from rvascend.models.random_model import ensure_random_model
    return Engine(load_model(ensure_random_model()), None, EngineConfig(**config))


def test_prefix_cache_evicts_under_pool_pressure_and_never_overcommits():
    """A pool of 96 slots and prompts of 40 distinct tokens: each request evicts the
    earlier ones' cached K/V, and answers as on a fresh engine."""
    engine = _random_engine(max_total_tokens=96)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [_random_prompt(40, seed) for seed in range(6)]
    want = [_random_engine(max_total_tokens=96, disable_radix_cache=True).generate([p], params)[0].output_ids
            for p in prompts[:2]]
    for i, prompt in enumerate(prompts):
        seq = engine.generate([prompt], params)[0]
        assert seq.finish_reason == "length"
        if i < 2:
            assert seq.output_ids == want[i]
        stats = engine.stats()
        assert stats["kv_used_tokens"] == 0 and stats["kv_cached_tokens"] <= 96
        assert len(engine.scheduler.free_slots) + stats["kv_cached_tokens"] == 96
    # Two at once sharing a prompt, in a pool that cannot hold three copies.
    both = engine.generate([prompts[0], prompts[0]], params)
    assert both[0].output_ids == both[1].output_ids == want[0]
    assert len(engine.scheduler.free_slots) + engine.stats()["kv_cached_tokens"] == 96


def test_identical_prompts_admitted_together_share_the_cached_copy():
    engine = _random_engine(max_total_tokens=256)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    prompt = _random_prompt(30, 3)
    a, b = engine.generate([prompt, prompt], params)
    assert a.output_ids == b.output_ids
    # The second copy's slots were given up for the tree's: one copy is cached.
    assert engine.stats()["kv_cached_tokens"] == 30 + 3
    assert len(engine.scheduler.free_slots) == 256 - 33


def test_a_request_sharing_a_prefill_under_way_waits_for_it_and_hits_the_cache():
    """Two requests with the same 64-token system prompt arrive together: the second
    waits until the first's prompt is cached, then prefills only its own question."""
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    system = _random_prompt(64, 8)
    prompts = [system + _random_prompt(6, 1), system + _random_prompt(6, 2), _random_prompt(40, 3)]
    plain = _random_engine(max_total_tokens=512, chunked_prefill_size=16, disable_radix_cache=True)
    want = [s.output_ids for s in plain.generate(prompts, params)]
    engine = _random_engine(max_total_tokens=512, chunked_prefill_size=16)
    seqs = engine.generate(prompts, params)
    assert [s.output_ids for s in seqs] == want
    assert [s.cached_tokens for s in seqs] == [0, 64, 0]


def test_flush_cache_and_failed_requests_are_not_cached():
    engine = _random_engine(max_total_tokens=256)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    prompt = _random_prompt(20, 5)
    engine.generate([prompt], params)
    assert engine.stats()["kv_cached_tokens"] == 22
    running = engine.add_request(prompt + [1], params)
    assert not engine.flush_cache()  # a request is queued
    engine.step()
    assert running.cached_tokens == 20 and not engine.flush_cache()
    while engine.has_work():
        engine.step()
    assert engine.flush_cache() and engine.stats()["kv_cached_tokens"] == 0
    assert len(engine.scheduler.free_slots) == 256
    assert engine.generate([prompt], params)[0].cached_tokens == 0
    assert engine.flush_cache()
    # A request that fails keeps nothing in the cache.
    forward = engine.model.forward

    def poisoned(batch, pool, **kwargs):
        if 1999 in batch.input_ids.tolist():
            raise RuntimeError("poisoned batch")
        return forward(batch, pool, **kwargs)
    engine.model.forward = poisoned
    try:
        bad = engine.generate([[1999] + prompt], params)[0]
    finally:
        engine.model.forward = forward
    assert bad.finish_reason == "error" and engine.stats()["kv_cached_tokens"] == 0
    assert len(engine.scheduler.free_slots) == 256


def test_checkpoint_errors(tmp_path, checkpoint):
    _, path = checkpoint
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path))
    bad = tmp_path / "bad"
    bad.mkdir()
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(str(bad))
    config["architectures"] = ["LlamaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(bad))


def test_missing_and_misshaped_tensors(tmp_path):
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(FAMILIES["qwen2"]()).save_pretrained(str(src))
    tensors = load_file(str(src / "model.safetensors"))
    for case, edit, match in [
        ("missing", lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"), "lacks tensors"),
        ("shape", lambda t: t.__setitem__("model.norm.weight", torch.ones(7)), "has shape"),
        ("extra", lambda t: t.__setitem__("model.bogus.weight", torch.ones(1)), "unexpected tensor"),
    ]:
        d = tmp_path / case
        d.mkdir()
        (d / "config.json").write_text((src / "config.json").read_text())
        t = dict(tensors)
        edit(t)
        save_file(t, str(d / "model.safetensors"))
        with pytest.raises(ValueError, match=match):
            load_model(str(d))


def test_sharded_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["qwen3"]())
    model.save_pretrained(str(tmp_path), max_shard_size="5MB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    ours = load_model(str(tmp_path), torch.float32)
    with torch.no_grad():
        want = model(_prompt()[None]).logits[0]
    assert torch.allclose(all_logits(ours, _prompt()), want, atol=1e-3)


def test_request_validation_and_queue_limit():
    from rvascend.models.random_model import ensure_random_model
    model = load_model(ensure_random_model())
    engine = Engine(model, None, EngineConfig(max_total_tokens=64, max_queued_requests=2, context_length=48))
    for prompt, params, match in [
        ([], SamplingParams(), "empty"),
        ([1, 2], SamplingParams(max_tokens=0), "at least 1"),
        (list(range(48)), SamplingParams(max_tokens=1), "context length"),
        ([1, 2], SamplingParams(max_tokens=47), "exceeds the context"),
        ([5000], SamplingParams(), "outside the vocabulary"),
        ([1], SamplingParams(top_p=0), "top_p"),
    ]:
        with pytest.raises(RequestError, match=match):
            engine.add_request(prompt, params)
    engine.add_request([1, 2], SamplingParams(max_tokens=2))
    engine.add_request([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(QueueFullError):
        engine.add_request([1, 2], SamplingParams(max_tokens=2))
    while engine.has_work():
        engine.step()
    assert engine.stats()["kv_used_tokens"] == 0 and engine.stats()["kv_reserved_tokens"] == 0


def test_sampling_is_reproducible_with_a_seed():
    from rvascend.models.random_model import ensure_random_model
    model = load_model(ensure_random_model())
    engine = Engine(model, None, EngineConfig(max_total_tokens=256))
    params = SamplingParams(max_tokens=8, temperature=1.5, top_p=0.9, seed=1234, ignore_eos=True)
    first = engine.generate([[0, 10, 20]], params)[0].output_ids
    second = engine.generate([[0, 10, 20]], params)[0].output_ids
    assert first == second


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Same request, same answer: with deterministic inference (the policy's invariant gate)
one request's greedy tokens and top-20 log-probabilities are bit for bit those it gets
alone, however it is batched (1 to 15 others, prefills and decodes mixed), after a
prefix-cache hit, in chunked prefill at three chunk sizes, and as a row of a 1 + 3 verify
step (speculative decoding); a seeded sampled request
draws the same tokens alone and batched. Llama-, Qwen2- (biases), Qwen3- and Qwen3.5-shaped models, in
BF16 (the packed kernels) and FP32 (the FP32 Linear and attention kernels)."""

from __future__ import annotations

import random
from typing import Optional

import pytest
import torch
import transformers

from rvascend.dispatch import kernel_routes
from rvascend.engine import Engine, EngineConfig, SamplingParams, ngram_draft
from rvascend.engine.testing import drafts_as_asked  # noqa: F401 - an autouse fixture
from rvascend.models.loader import load_model
from rvascend.models.testing import tiny_qwen3_5_config
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy



COMMON = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=16,
              num_key_value_heads=4, vocab_size=2048, max_position_embeddings=1024, initializer_range=0.05)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=64, tie_word_embeddings=False),
    # q/k/v biases: added after the packed product under the invariant gate
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=False),
    "qwen3.5": lambda: tiny_qwen3_5_config(2048, tie=True),
}


@pytest.fixture(scope="module", params=[(f, d) for f in sorted(FAMILIES) for d in ("bfloat16", "float32")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request, tmp_path_factory):
    family, dtype = request.param
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp(family.replace(".", "_")))
    config = FAMILIES[family]()
    cls = transformers.Qwen3_5ForCausalLM if family == "qwen3.5" else transformers.AutoModelForCausalLM
    (cls(config) if family == "qwen3.5" else cls.from_config(config)).save_pretrained(path)
    m = load_model(path, getattr(torch, dtype))
    install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    assert get_policy(m).shape_gate == "invariant"
    return m


def _run(model, target: list[int], params: SamplingParams, others: int = 0, chunk: int = 512,
         cache_first: bool = False, drafts: int = 0, stats: Optional[dict] = None) -> list:
    rng = random.Random(others * 31 + chunk)
    vocab = model.config.vocab_size
    engine = Engine(model, None, EngineConfig(max_total_tokens=8192, chunked_prefill_size=chunk,
                                              max_running_requests=32, disable_radix_cache=not cache_first,
                                              speculative_algorithm="NGRAM" if drafts else None,
                                              speculative_num_draft_tokens=max(drafts, 1)))
    if cache_first:  # a request sharing the first 48 tokens runs first: the target's prefix is cached
        engine.generate([target[:48] + [5, 6, 7]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    outputs = []
    engine.add_request(target, params, on_output=lambda s, o: outputs.append((o.token_id, o.logprob, o.top_logprobs)))
    for i in range(others):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(5, 120))]
        engine.add_request(prompt, SamplingParams(max_tokens=rng.randrange(4, 20), temperature=1.0, seed=i,
                                                  ignore_eos=True))
    while engine.has_work():
        engine.step()
    if stats is not None:
        stats.update(engine.stats())
    return [o for o in outputs if o[0] is not None]


def test_a_requests_logits_do_not_depend_on_its_batch(model, monkeypatch):
    # Past this many keys a prompt's attention would leave the row kernel for SDPA (on a set
    # without a block form): here the 70-token prompt is past it, and stays on the kernel.
    monkeypatch.setattr(kernel_routes, "ROW_KERNEL_PREFILL_KEYS", 40)
    policy = get_policy(model)
    policy.kernels.counters.reset()
    policy.counters.reset()
    rng = random.Random(0)
    target = [rng.randrange(3, model.config.vocab_size) for _ in range(70)]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=20)
    alone = _run(model, target, params)
    assert len(alone) == 10
    cases = {f"{k} others": dict(others=k) for k in (1, 3, 7, 15)}
    cases.update({f"chunk {c}": dict(chunk=c) for c in (16, 29, 64)})
    cases["chunk 16 with 7 others"] = dict(chunk=16, others=7)
    # Rows of a 1 + 3 verify step: every decode step drafts the target's own first tokens,
    # whatever the model says, so steps take all, part or none of a draft.
    monkeypatch.setattr(ngram_draft.NgramIndex, "propose", lambda self, prompt, output, k: target[:k])
    verify_stats: dict = {}
    cases["verify rows, 3 drafts"] = dict(drafts=3, stats=verify_stats)
    if model.config.linear_attention is None:  # hybrids keep no prefix cache
        cases["prefix-cache hit"] = dict(cache_first=True)
    differs = [name for name, kw in cases.items() if _run(model, target, params, **kw) != alone]
    assert not differs, differs
    assert verify_stats["spec_drafted_tokens"] > 0
    assert policy.kernels.counters.calls("kv_pool_attention", "fallback") == 0
    # Every projection took an invariant kernel: packed (BF16) or the FP32 Linear.
    assert policy.counters.calls(route="fallback") == 0 and policy.counters.calls(route="row_major") == 0
    invariant = "fp32_invariant" if model.lm_head.weight.dtype == torch.float32 else "packed"
    assert policy.counters.calls(route=invariant) > 0


def test_a_seeded_sample_does_not_depend_on_its_batch(model):
    target = list(range(10, 40))
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    alone = _run(model, target, params)
    assert _run(model, target, params, others=7) == alone
    assert _run(model, target, params, others=3, chunk=16) == alone

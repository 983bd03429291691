"""Test helpers that need the engine or the installed policy: a model loaded for exact
comparison, a greedy run through the engine, and the fused step against op by op on two
Runners (models/testing.py)."""

from __future__ import annotations

import contextlib
from typing import Union

import pytest
import torch

from rvascend.dispatch.fused_decoder import held_off
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine import engine as engine_module
from rvascend.models.decoder import CausalLM
from rvascend.models.loader import load_model
from rvascend.models.testing import Runner
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy


@pytest.fixture(autouse=True)
def drafts_as_asked(monkeypatch):
    """Imported by a test module: every sequence there drafts what its budget asks, whatever it
    costs. Its tests are about what drafting does, and timing must not decide what they see
    (draft_cost_test: how many tokens the cost lets a sequence draft)."""
    monkeypatch.setattr(engine_module, "parse_cost_model", lambda spec: None)


def load_exact_or_fp32(path: str, kind: str) -> CausalLM:
    """`kind` "float32": through ATen (a row's logits depend on how many rows its matmuls had:
    tokens must agree, logprobs to FP32 rounding); "bf16_deterministic": BF16 under
    deterministic inference (everything bit for bit). `.exact` says which."""
    if kind == "float32":
        model = load_model(path, torch.float32)
        model.exact = False
        return model
    model = load_model(path, torch.bfloat16)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    model.exact = True
    return model


def greedy(model: CausalLM, ids: Union[list[int], torch.Tensor], n: int) -> list[int]:
    """n greedy tokens after `ids` through the engine (EOS ignored); the pool must end empty."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    engine = Engine(model, None, EngineConfig(max_total_tokens=len(ids) + n + 64))
    (seq,) = engine.generate([ids], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    assert engine.stats()["kv_used_tokens"] == 0
    return seq.output_ids



def assert_fused_decode_matches_op_by_op(model, prompts: list[list[int]], steps: int, vocab: int) -> None:
    """Prefills `prompts`, then runs `steps` decode steps twice, op by op and through the
    policy's fused step (on two Runners from the same stale state): the logits, the K/V pool
    and a hybrid model's conv and delta-rule states are bit for bit equal after every step,
    and so are the route counts (but the fused step's own)."""
    policy = get_policy(model)
    runners = Runner(model, len(prompts), 0), Runner(model, len(prompts), 0)
    for runner in runners:
        runner.step([(i, p, 0) for i, p in enumerate(prompts)])  # prompts: the same path for both

    def pool_tensors(runner: Runner) -> list[torch.Tensor]:
        pool = runner.pool
        return [*pool.k, *pool.v, *pool.states.conv, *pool.states.ssm] if pool.states else [*pool.k, *pool.v]

    for step in range(steps):
        rows = [(i, [(7 * step + 3 * i) % vocab], len(p) + step) for i, p in enumerate(prompts)]
        logits, counts = [], []
        for runner, fused in zip(runners, (False, True)):
            policy.counters.reset()
            policy.kernels.counters.reset()
            with contextlib.nullcontext() if fused else held_off(model):
                logits.append(runner.step(rows))
            counts.append((policy.counters.snapshot(),
                           [c for c in policy.kernels.counters.snapshot() if c["projection"] != "decoder_layers"]))
        assert policy.kernels.counters.calls("decoder_layers", "kernel") == 1, policy.kernels.counters.snapshot()
        assert torch.equal(logits[1], logits[0]), (step, (logits[1].float() - logits[0].float()).abs().max())
        assert counts[0] == counts[1]
        for a, b in zip(pool_tensors(runners[0]), pool_tensors(runners[1])):
            assert torch.equal(a, b)

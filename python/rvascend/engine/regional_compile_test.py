"""Regional compile: the decoder layer compiled once for every layer and every row
count, the packed routes inside it still checked at run time, and the eager
fallback where Inductor cannot run."""

from __future__ import annotations

import sys

import pytest
import torch
import transformers

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models.loader import load_model
from rvascend.models.testing import all_logits
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy
from rvascend.policy import regional_compile

# Qwen3: q/k norms, RoPE, SiLU-and-multiply and the residual adds are all in the compiled halves.
CONFIG = transformers.Qwen3Config(hidden_size=1024, intermediate_size=2048, num_hidden_layers=3,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=128, vocab_size=2048,
                                  max_position_embeddings=512, initializer_range=0.05, tie_word_embeddings=True)
# kernels=False: no fused decode step, so decode steps run the compiled layer too.
REGIONAL = KernelPolicyConfig(compile_mode="regional", kernels=False, shape_gate="bucketed")  # its buckets


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("qwen3"))
    transformers.AutoModelForCausalLM.from_config(CONFIG).save_pretrained(path)
    return path


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # BF16 activations: Inductor's fused element-wise code rounds at other points than eager.
    return bool((a.float() - b.float()).abs().max() <= 0.05 * b.float().abs().max() + 0.05)


def _serve(model, prompts: list[list[int]], max_tokens: int) -> None:
    engine = Engine(model, None, EngineConfig(max_total_tokens=1024, max_running_requests=len(prompts)))
    engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def test_one_graph_set_serves_every_layer_and_row_count(checkpoint):
    reference = load_model(checkpoint, torch.bfloat16)
    model = load_model(checkpoint, torch.bfloat16)
    report = install_kernel_policy(model, REGIONAL)
    assert report.compile_mode == "regional"
    ids = torch.arange(40) * 7 % 2048
    assert close(all_logits(model, ids), all_logits(reference, ids))
    policy = get_policy(model)
    # Prefill rows went through the packed op inside the compiled graph.
    assert policy.counters.rows_seen("qkv_proj", "packed") == {40: 3}
    for batch in (1, 2, 3, 5, 8):
        _serve(model, [[(i * 13 + j) % 2048 for j in range(9 + i)] for i in range(batch)], 3)
    graphs = policy.regional.graphs
    # One row and any rows, per method; the first layer's first half also sees no residual yet.
    assert len(graphs) <= 6, graphs
    assert {name for name, _ in graphs} == {"DecoderLayer.before_attention", "DecoderLayer.after_attention"}
    fallbacks = {(c["projection"], c["reason"]) for c in policy.counters.snapshot() if c["route"] == "fallback"}
    assert fallbacks == {("lm_head", "lm_head_prefill_rows")}, fallbacks  # all_logits' 40 lm_head rows


def test_compiled_layer_follows_a_weight_written_through_data(checkpoint):
    reference = load_model(checkpoint, torch.bfloat16)
    model = load_model(checkpoint, torch.bfloat16)
    install_kernel_policy(model, REGIONAL)
    ids = torch.arange(24) * 5 % 2048
    all_logits(model, ids)  # compiles with the packed copy of the original weights
    for m in (model, reference):
        w = m.model.layers[1].mlp.down_proj.weight
        w.data.copy_(torch.flip(w.data, dims=[0]))  # a loader's write: no version bump
    got, want = all_logits(model, ids), all_logits(reference, ids)
    assert close(got, want)
    counters = get_policy(model).counters
    assert counters.calls("down_proj", "fallback", "weight_content_changed") == 1, counters.snapshot()


def test_without_a_compiler_the_routes_run_eagerly_and_say_so(checkpoint, monkeypatch):
    monkeypatch.setattr(regional_compile, "cxx_compiler", lambda: None)
    model = load_model(checkpoint, torch.bfloat16)
    report = install_kernel_policy(model, REGIONAL)
    policy = get_policy(model)
    assert report.compile_mode == "eager" and policy.regional is None
    assert policy.counters.calls("regional_compile", "fallback", "no_cxx_compiler") == 1
    assert "before_attention" not in model.model.layers[0].__dict__


def test_uninstall_on_failure_removes_the_compiled_methods(checkpoint, monkeypatch):
    from rvascend.policy import install

    model = load_model(checkpoint, torch.bfloat16)

    def fail(self):
        raise MemoryError("simulated")
    monkeypatch.setattr(install.KernelPolicy, "pack_all", fail)
    with pytest.raises(MemoryError):
        install_kernel_policy(model, REGIONAL)
    assert all("before_attention" not in layer.__dict__ for layer in model.model.layers)
    assert all("forward" not in m.__dict__ for m in model.modules())



def test_deterministic_inference_runs_eagerly_and_refuses_regional_compile(checkpoint):
    # A graph compiled per row bucket could fuse differently: under deterministic inference the
    # policy runs eagerly unless told otherwise, and refuses to be told regional.
    model = load_model(checkpoint, torch.bfloat16)
    install_kernel_policy(model, KernelPolicyConfig(deterministic=True, kernels=False))
    assert get_policy(model).compile_mode == "eager" and get_policy(model).regional is None
    assert KernelPolicyConfig().compiles_regionally and not KernelPolicyConfig(deterministic=True).compiles_regionally
    with pytest.raises(ValueError, match="--cpu-compile-mode regional contradicts it"):
        install_kernel_policy(load_model(checkpoint, torch.bfloat16),
                           KernelPolicyConfig(deterministic=True, compile_mode="regional"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

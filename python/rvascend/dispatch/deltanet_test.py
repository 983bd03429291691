"""A tiny random Qwen3-Next generates the same greedy tokens with decode routed through the op."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from rvascend.dispatch.deltanet import install_deltanet_decode

transformers = pytest.importorskip("transformers")


def tiny_qwen3_next():
    config = transformers.Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        full_attention_interval=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("batch", [1, 2])
def test_same_greedy_tokens_with_decode_routed(batch):
    base = tiny_qwen3_next()
    routed = copy.deepcopy(base)
    counters = install_deltanet_decode(routed)
    ids = torch.randint(0, 256, (batch, 10), generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        want = base.generate(ids, max_new_tokens=8, do_sample=False)
        got = routed.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)
    layers = sum(1 for m in routed.modules() if type(m).__name__ == "Qwen3NextGatedDeltaNet")
    # Every decode step after the prefill, in every linear-attention layer, went through the op.
    assert counters.decode_via_op == 7 * layers
    assert counters.tokens_via_op == 7 * layers * batch


def test_logits_match_on_a_decode_step():
    base = tiny_qwen3_next()
    routed = copy.deepcopy(base)
    install_deltanet_decode(routed)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a = base(ids, use_cache=True)
        b = routed(ids, use_cache=True)
        nxt = a.logits[:, -1:].argmax(-1)
        step_a = base(nxt, cache=a.past_key_values, use_cache=True).logits
        step_b = routed(nxt, cache=b.past_key_values, use_cache=True).logits
    assert torch.allclose(step_a, step_b, atol=1e-4, rtol=1e-4)


def test_a_model_without_gated_deltanet_is_rejected():
    with pytest.raises(ValueError, match="no Qwen3NextGatedDeltaNet"):
        install_deltanet_decode(torch.nn.Linear(2, 2))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

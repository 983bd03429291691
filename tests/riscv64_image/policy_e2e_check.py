"""Inside the riscv64 image: small Llama-, Qwen3- and Qwen3.5-architecture
models generate the same greedy tokens with the RVV policy on and off, and
every RVV kernel ran (packed Linears, pool attention, RMSNorm with the
residual add, q/k norm + RoPE, SiLU*mul, argmax, and the decode steps' layers
in one native call; for the Qwen3.5 hybrid its zero-centred norms, and its
DeltaNet layers' one native call, prompts included) with no fallback; and none of it
imports sympy.

Runs with the image's python3.13 and torch 2.6 (no tokenizers there: token ids
in, token ids out). The checkpoint is written here with random weights.
"""

import sys

import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models.testing import IMAGE_LLAMA as LLAMA, IMAGE_QWEN3_5 as QWEN3_5, write_random_checkpoint
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy

QWEN3 = dict(LLAMA, architectures=["Qwen3ForCausalLM"], num_hidden_layers=2, rope_theta=1000000.0)
KERNELS = ("kv_pool_attention", "rope", "silu_mul", "add_rms_norm", "argmax", "decoder_layers")
# The hybrid's kernels: its gated attention's zero-centred q/k norms and partial RoPE on the
# rope kernel and its output gate on sigmoid_mul, the DeltaNet layers' prompt work in their
# own call (counted below), and the decode steps' layers of both kinds in the fused step.
HYBRID_KERNELS = ("kv_pool_attention", "rope", "sigmoid_mul", "silu_mul", "add_rms_norm", "rms_norm", "argmax",
                  "decoder_layers")


def check(name: str, config: dict, kernels_expected: tuple = KERNELS) -> bool:
    path = write_random_checkpoint(config)
    prompts = [[int(t) for t in torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (8, 5)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens = {}
    for mode in ("off", "on"):
        model = load_model(path)
        if mode == "on":
            install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager"))
        engine = Engine(model, None, EngineConfig(max_total_tokens=64))
        tokens[mode] = [s.output_ids for s in engine.generate(prompts, params)]  # two sequences: M = 2
        if mode == "on":
            policy = get_policy(model)
            packed = policy.counters.calls(route="packed")
            kernels = {k: policy.kernels.counters.calls(k, "kernel") for k in kernels_expected}
            # The hybrid's prefill steps run the layers module by module (the fused step says so:
            # its DeltaNet prompts take the chunked rule); the others' run fused.
            fallbacks = (policy.kernels.counters.calls(route="fallback")
                         - policy.kernels.counters.calls("decoder_layers", "fallback", "prefill"))
    print(f"{name}: policy off: {tokens['off']}")
    print(f"{name}: policy on:  {tokens['on']} ({packed} packed calls, kernels {kernels}, {fallbacks} fallbacks)")
    ok = tokens["on"] == tokens["off"] and packed > 0 and all(kernels.values()) and fallbacks == 0
    if not ok:
        print(f"FAILED {name}: greedy tokens differ, or a kernel never ran, or one fell back")
    return ok


def check_hybrid() -> bool:
    """Qwen3.5: check() with its kernels, every DeltaNet layer's step in its one native call
    (policy off: prefill and decode; on: prefill, its decode steps in the fused step)."""
    from rvascend.models import qwen3_5
    from rvascend.ops import recurrent_gated_delta_rule

    calls = []
    real = recurrent_gated_delta_rule.deltanet_decode

    def counted(*args):
        calls.append(1)
        return real(*args)

    recurrent_gated_delta_rule.deltanet_decode = counted
    try:
        ok = check("qwen3.5", QWEN3_5, HYBRID_KERNELS)
    finally:
        recurrent_gated_delta_rule.deltanet_decode = real
    # One prefill and 5 decode steps with the policy off, then the prefill with it on; 3 DeltaNet
    # layers each.
    print(f"qwen3.5: prompts through the DeltaNet call: {qwen3_5.RECURRENT_PROMPTS}, {len(calls)} calls")
    if len(calls) != (6 + 1) * 3 or not qwen3_5.RECURRENT_PROMPTS:
        print("FAILED qwen3.5: a DeltaNet step did not take its native call")
        return False
    return ok


def check_no_sympy() -> bool:
    """Building a model on the meta device must not reach PyTorch's Python reference kernels
    (torch 2.6's ones() and zeros() there import sympy: 43 s of a board process's start)."""
    if "sympy" in sys.modules:
        print("FAILED: loading, installing the policy or generating imported sympy")
        return False
    return True


def main() -> int:
    results = [check("llama", LLAMA), check("qwen3", QWEN3), check_hybrid(), check_no_sympy()]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

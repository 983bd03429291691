"""Inside the riscv64 image: with deterministic inference one request's greedy tokens and
top-5 log-probabilities are bit for bit those it gets alone when it is batched with
others, prefilled in chunks, or verified as a row of a speculative step (1 + K rows),
for a Llama- and a Qwen3.5-architecture model on the RVV kernels (their RVV builds,
the image's torch 2.6), and the Llama one in FP32 (the FP32 Linear and attention rows
built with V). The host checks the same on x86 (engine/batch_invariance_test.py).
"""

import random
import sys

import torch

from rvascend.engine import Engine, EngineConfig, SamplingParams, ngram_draft
from rvascend.models.testing import IMAGE_LLAMA, IMAGE_QWEN3_5, write_random_checkpoint
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy


def run(model, target, others=0, chunk=512, drafts=0):
    engine = Engine(model, None, EngineConfig(max_total_tokens=1024, chunked_prefill_size=chunk,
                                              disable_radix_cache=True,
                                              speculative_algorithm="NGRAM" if drafts else None,
                                              speculative_num_draft_tokens=max(drafts, 1),
                                              speculative_step_costs="none"))  # every step verifies them
    outputs = []
    engine.add_request(target, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=5),
                       on_output=lambda s, o: outputs.append((o.token_id, o.logprob, o.top_logprobs)))
    rng = random.Random(others)
    for i in range(others):
        prompt = [rng.randrange(3, 1024) for _ in range(rng.randrange(4, 12))]
        engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True))
    while engine.has_work():
        engine.step()
    return [o for o in outputs if o[0] is not None], engine.stats()


def check(name, config, dtype=torch.bfloat16):
    model = load_model(write_random_checkpoint(config), dtype)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", deterministic=True))
    target = [int(t) for t in torch.randint(3, 1024, (18,), generator=torch.Generator().manual_seed(5))]
    # Every decode step verifies three drafted tokens (rows of 1 + 3), whatever the model says.
    ngram_draft.NgramIndex.propose = lambda self, prompt, output, k: target[:k]
    alone, _ = run(model, target)
    differs = []
    # Batched and chunked in one run (the host's test checks each alone): under QEMU a run
    # costs about half a minute, and a change in either shows here.
    for label, kwargs in (("3 others, chunks of 7", {"others": 3, "chunk": 7}), ("verify rows", {"drafts": 3})):
        got, stats = run(model, target, **kwargs)
        if got != alone:
            differs.append(label)
        if kwargs.get("drafts") and not stats["spec_drafted_tokens"]:
            differs.append("verify rows (nothing was drafted)")
    print(f"{name}: alone {[o[0] for o in alone]}; differs: {differs or 'none'}")
    return not differs


def main():
    results = [check("llama", IMAGE_LLAMA), check("qwen3.5", IMAGE_QWEN3_5),
               check("llama fp32", IMAGE_LLAMA, torch.float32)]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

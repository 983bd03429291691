"""Inside the riscv64 image: a small Llama-architecture model generates the same
greedy tokens with the RVV policy on and off, and the packed kernels ran.

Runs with the image's python3.13 and torch 2.6 (no tokenizers there: token ids
in, token ids out). The checkpoint is written here with random weights.
"""

import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file

from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.engine.default_model import random_weights
from rvascend.models.loader import load_model
from rvascend.policy import RvvPolicyConfig, get_policy, install_rvv_policy

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 1024,
          "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
          "vocab_size": 1024, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 256,
          "tie_word_embeddings": True, "eos_token_id": 1}


def main() -> int:
    path = tempfile.mkdtemp()
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    save_file(random_weights(CONFIG, seed=0), os.path.join(path, "model.safetensors"))
    prompt = [int(t) for t in torch.randint(0, 1024, (8,), generator=torch.Generator().manual_seed(0))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens = {}
    for mode in ("off", "on"):
        model = load_model(path)
        if mode == "on":
            install_rvv_policy(model, RvvPolicyConfig(compile_mode="eager"))
        engine = Engine(model, None, EngineConfig(max_total_tokens=64))
        tokens[mode] = engine.generate([prompt], params)[0].output_ids
        if mode == "on":
            packed = get_policy(model).counters.calls(route="packed")
    print("policy off:", tokens["off"])
    print("policy on: ", tokens["on"], f"({packed} packed-kernel calls)")
    if tokens["on"] != tokens["off"] or packed == 0:
        print("FAILED: greedy tokens differ or the packed kernels never ran")
        return 1
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

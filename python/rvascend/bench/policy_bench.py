"""Decode-step time of a Llama-3.2-1B-shaped model with the RVV policy vs without.

Random weights, full Llama-3.2-1B widths (hidden 2048, intermediate 8192,
vocab 128256, 32/8 heads of 64, tied lm_head) and a few layers. For each M
(decoding sequences) one decode step over M sequences with a 64-token prefix
is timed, interleaved, policy off vs on; the policy runs at 0 %, 50 % and 100 %
of the memory budget its full packing needs (partial packing). It also reports
the extra peak RSS of packing.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from absl import app, flags, logging

from rvascend.bench.results import print_table, write_jsonl
from rvascend.testing.rss import current_rss_mib, peak_rss_mib
from rvascend.bench.timing import time_calls
from rvascend.models.random_model import random_weights
from rvascend.models.config import ModelConfig
from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.ops import packed_weight_bytes
from rvascend.policy import KernelPolicyConfig, install_kernel_policy

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_integer("layers", 4, "Decoder layers (Llama-3.2-1B has 16).")
    flags.DEFINE_list("rows", ["1", "2", "3", "4", "8", "16"], "Decoding sequences (M).")
    flags.DEFINE_list("budgets", ["0", "50", "100"], "Packing budget, % of what full packing needs.")
    flags.DEFINE_enum("cpu-compile-mode", "regional", ["regional", "eager"], "Policy compile mode.")
    flags.DEFINE_integer("prefix", 64, "Cached tokens per sequence.")
    flags.DEFINE_string("output", "bench_results/policy.jsonl", "jsonl file to append to.")


LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


def build(layers: int) -> CausalLM:
    raw = dict(LLAMA_3_2_1B, num_hidden_layers=layers)
    config = ModelConfig.from_dict(raw)
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.rotary.__init__(config)
    tensors = random_weights(raw, seed=0)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            for part, (fused, shard) in CausalLM.STACKED.items():
                if f".{part}." in name:
                    module = model.get_submodule(name.rsplit(".", 2)[0] + "." + fused)
                    module.load_shard("weight", shard, t)
                    break
            else:
                params[name].copy_(t)
    return model.eval()


def decode_batch(model: CausalLM, m: int, prefix: int) -> tuple[ForwardBatch, KVPool]:
    pool = KVPool(model.config, m * (prefix + 1), torch.bfloat16)
    slots = [torch.arange(i * (prefix + 1), (i + 1) * (prefix + 1)) for i in range(m)]
    batch = ForwardBatch(torch.randint(0, model.config.vocab_size, (m,)), torch.full((m,), prefix),
                         [1] * m, [prefix] * m, slots, torch.stack([s[-1] for s in slots]))
    return batch, pool


def full_packing_mib(model: CausalLM) -> float:
    total = 0
    for name, module in model.named_modules(remove_duplicate=False):
        if name.rsplit(".", 1)[-1] in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"):
            total += packed_weight_bytes(*module.weight.shape)
    return total / 2**20


def main(argv: list[str]) -> int:
    del argv
    base = build(FLAGS.layers)
    need = full_packing_mib(base)
    rows = [int(r) for r in FLAGS.rows]
    records: list[dict[str, Any]] = []
    for pct in (int(b) for b in FLAGS.budgets):
        routed = copy.deepcopy(base)
        rss0, peak0 = current_rss_mib(), peak_rss_mib()
        report = install_kernel_policy(routed, KernelPolicyConfig.from_flag(
            memory_budget_mib=int(need * pct / 100), compile_mode=FLAGS["cpu-compile-mode"].value))
        extra_rss = current_rss_mib() - rss0
        for m in rows:
            batch, pool = decode_batch(base, m, FLAGS.prefix)
            with torch.inference_mode():
                off, on = time_calls([lambda: base(batch, pool), lambda: routed(batch, pool)], min_seconds=0.5)
            records.append({"bench": "policy_decode_step", "layers": FLAGS.layers, "m": m, "budget_pct": pct,
                            "packed_mib": report.packed_bytes / 2**20, "packed_modules": len(report.packed),
                            "off_s": off, "on_s": on, "speedup": off / on, "extra_rss_mib": extra_rss,
                            "peak_rss_growth_mib": peak_rss_mib() - peak0})
            logging.info("budget %d%% M=%d: off %.2f ms on %.2f ms", pct, m, off * 1e3, on * 1e3)
        del routed
    print_table(records, [("budget_pct", "budget %", "d"), ("packed_mib", "packed MiB", ".0f"), ("m", "M", "d"),
                          ("off_s", "off s", ".4f"), ("on_s", "on s", ".4f"), ("speedup", "off/on", ".2f"),
                          ("extra_rss_mib", "extra RSS", ".0f")])
    from rvascend.repro import manifest
    write_jsonl(FLAGS.output, records, manifest.capture())
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

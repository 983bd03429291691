"""The whole-step profiler's guest, run on the host: it drives the engine's internals
(running sequences set up without a prefill, steps rewound), so an engine change that
breaks it must fail here, not only in an hour-long QEMU benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import rvascend
from safetensors.torch import save_file

from rvascend.bench.riscv64_step import HYBRID_LINEARS, LINEARS
from rvascend.models import random_checkpoint
from rvascend.models.random_model import ensure_random_model, random_weights

_GUEST = os.path.join(os.path.dirname(__file__), "riscv64_step_guest.py")


def _hybrid_checkpoint(directory: str) -> str:
    """Qwen3.5's pattern (three DeltaNet layers, then full attention) at a tiny width."""
    config = dict(random_checkpoint.SHAPES["qwen3.5-0.8b"], hidden_size=64, intermediate_size=96,
                  num_hidden_layers=4, num_attention_heads=4, head_dim=32, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=512)
    config["layer_types"] = config["layer_types"][:4]
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    save_file(random_weights(config, 0), os.path.join(directory, "model.safetensors"))
    return directory


@pytest.mark.parametrize("model", ["llama", "qwen3.5"])
@pytest.mark.parametrize("mode", ["off", "op_by_op", "full"])
def test_the_guest_marks_every_region_of_decode_and_prefill_steps(mode, model, tmp_path):
    # turn5: 5 prompt tokens after 16 the prefix cache holds (a chat's next turn).
    configs = [[16, 1, "decode"], [24, 2, "decode"], [12, 1, "prefill"], [16, 2, "verify2"], [16, 1, "turn5"]]
    if model == "qwen3.5":
        configs += [[16, 1, "nextn2"], [16, 1, "nextn1h100"]]  # the MTP head's draft pass inside the step
    checkpoint = ensure_random_model() if model == "llama" else _hybrid_checkpoint(str(tmp_path))
    args = json.dumps({"checkpoint": checkpoint, "mode": mode, "configs": configs})
    package = os.path.dirname(os.path.dirname(rvascend.__file__))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, _GUEST, args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("STEP ")]
    assert [[s["context"], s["rows"], s["kind"]] for s in steps] == configs
    for step in steps:
        regions = set(step["regions"])
        linears = set(LINEARS) if model == "qwen3.5" else set(LINEARS) - set(HYBRID_LINEARS)
        assert linears <= regions and {"attention", "rms_norm", "embedding", "sampling"} <= regions
        assert ("mtp_draft" in regions) == step["kind"].startswith("nextn"), step["kind"]
        if model == "qwen3.5":
            assert "deltanet" in regions
            # Decode steps run the gated norm inside the layer's one native call (deltanet_decode),
            # and so do prefill steps where prompts take it (riscv64).
            from rvascend.models import qwen3_5

            prefill_in_torch = step["kind"] != "decode" and not qwen3_5.RECURRENT_PROMPTS
            assert ("deltanet_norm" in regions) == prefill_in_torch, step["kind"]
        # Markers: the total's two (its interval is the one between them), then the breakdown's.
        assert step["marked_first_interval"] == step["total_interval"] + 2
        assert step["marked_last_interval"] - step["marked_first_interval"] + 1 == len(step["regions"])
    assert any(line.startswith("MAPS ") for line in proc.stdout.splitlines())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

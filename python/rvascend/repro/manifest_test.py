"""A manifest matches its own environment and names every pinned thing that changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from rvascend.repro import manifest


@pytest.fixture
def checkpoint(tmp_path):
    from safetensors.torch import save_file
    path = tmp_path / "ckpt"
    path.mkdir()
    save_file({"w": torch.arange(16, dtype=torch.float32)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return str(path)


def test_manifest_records_the_four_pins(checkpoint):
    m = manifest.capture(checkpoint_dir=checkpoint)
    assert m["source"]["commit"] is None or len(m["source"]["commit"]) == 40
    assert set(m["checkpoint"]["files"]) == {"model.safetensors", "config.json"}
    assert m["runtime"]["torch"] == torch.__version__ and m["runtime"]["packages_count"] > 10
    assert m["compile_cache"]["state"] in ("cold", "warm") and "dir" in m["compile_cache"]
    assert {"qemu", "riscv64_image", "toolchain_root"} <= set(m["toolchain"]["locks"])
    assert m["threads"]["torch_threads"] == torch.get_num_threads()


def test_same_environment_has_no_differences(checkpoint):
    assert manifest.differences(manifest.capture(checkpoint), manifest.capture(checkpoint)) == []


def test_a_changed_weight_file_is_reported(checkpoint):
    saved = manifest.capture(checkpoint)
    with open(os.path.join(checkpoint, "model.safetensors"), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    diffs = manifest.differences(saved, manifest.capture(checkpoint))
    assert len(diffs) == 1 and diffs[0].startswith("checkpoint.files.model.safetensors")


def test_changed_threads_and_packages_are_reported(checkpoint):
    saved = manifest.capture(checkpoint)
    saved["threads"]["torch_threads"] += 1
    saved["runtime"]["packages_sha256"] = "0" * 64
    keys = {d.split(":")[0] for d in manifest.differences(saved, manifest.capture(checkpoint))}
    assert keys == {"threads.torch_threads", "runtime.packages_sha256"}


def test_verify_command_on_a_bench_jsonl(tmp_path, checkpoint):
    """A benchmark's records carry the manifest they ran under (bench/results.write_jsonl;
    one_batch_test checks its records load here)."""
    jsonl = str(tmp_path / "bench.jsonl")
    record = {"bench": "x", "value": 1, "manifest": manifest.capture(checkpoint)}
    (tmp_path / "bench.jsonl").write_text(json.dumps(record) + "\n")
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "rvascend.repro", "verify", jsonl]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shutil.copy(os.path.join(checkpoint, "config.json"), os.path.join(checkpoint, "extra.json"))
    changed = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert changed.returncode == 1 and "checkpoint.files.extra.json" in changed.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

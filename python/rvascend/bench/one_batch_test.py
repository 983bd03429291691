"""one_batch's runs: each policy's figures in its own record, run by run in turn with
--interleave."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _run(tmp_path, *flags: str) -> tuple[list[dict], str]:
    out = tmp_path / "one_batch.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-m", "rvascend.bench.one_batch", "--shape=test", "--input-len=8",
                           "--output-len=3", "--batch-size=2", "--warmup=1", "--repeats=2", "--threads=1",
                           "--cpu-compile-mode=eager", f"--output={out}", "--plot=", *flags],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()], done.stderr


def test_interleaved_runs_take_turns_and_report_each_policy(tmp_path):
    from rvascend.repro import manifest

    records, log = _run(tmp_path, "--policy=off,drop", "--interleave")
    assert manifest.load(str(tmp_path / "one_batch.jsonl")) == records[0]["manifest"]  # what repro verifies
    assert [r["run_name"] for r in records] == ["rvascend-policy-off", "rvascend-policy-drop"]
    for r in records:
        assert r["interleaved"] is True and r["timed_runs"] == 2
        assert r["prefill_throughput"] > 0 and r["median_decode_throughput"] > 0
        assert "peak_rss_mib" not in r  # one process holds both models: no figure of either's own
    # Warm-up and timed runs alike go through the policies in turn.
    assert log.count("policy off, drop in turn") == 3


def test_separate_runs_report_their_own_peak_rss(tmp_path):
    records, _ = _run(tmp_path, "--policy=off,drop")
    assert [r["run_name"] for r in records] == ["rvascend-policy-off", "rvascend-policy-drop"]
    assert all(r["peak_rss_mib"] > 0 and "interleaved" not in r for r in records)


def test_bytes_a_step_reads_of_a_model_kept_quantized_are_its_quantized_buffers(tmp_path):
    """one_batch's bytes per step (its GB/s and roofline) of a model kept quantized are
    its quantized buffers, not the BF16 matrices it no longer has."""
    from rvascend.bench.one_batch import weight_bytes_per_step
    from rvascend.models.loader import load_model
    from rvascend.models.quantized_layers import quantized_modules
    from rvascend.models.testing import write_tiny_gguf

    path = write_tiny_gguf("llama", "Q8_0", tmp_path)
    dense, kept = load_model(path), load_model(path, keep_quantized=True)
    buffers = sum(b.numel() for _, module in quantized_modules(kept) for n, b in module.named_buffers()
                  if n.startswith("qweight"))
    assert weight_bytes_per_step(kept) == buffers
    # Q8_0: 34 bytes per 32 weights (the runtime layout's tiles pad nothing at these widths).
    assert weight_bytes_per_step(kept) == pytest.approx(weight_bytes_per_step(dense) * 34 / 64, rel=0.01)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""RVASCEND_MAX_ISA: one cap on what every kernel family may use, so an AVX-512 host
runs (and benchmarks) what an AVX2-only host would."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

_REPORT = """
import json
import torch
import torch.nn.functional as F
from rvascend import ops
from rvascend.ops import elementwise, recurrent_gated_delta_rule, quantized_linear

torch.manual_seed(0)
x = torch.randn(5, 96).bfloat16()
w = torch.randn(80, 96).bfloat16()
got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w), 80).double()
want = F.linear(x.double(), w.double())
print(json.dumps({
    "features": ops.cpu_features(),
    "linear": ops.available_kernel_sets(),
    "quantized": quantized_linear.available_quant_kernel_sets(),
    "attention": ops.available_attention_kernels(),
    "elementwise": elementwise.available_elementwise_kernels(),
    "recurrent_gated_delta_rule": recurrent_gated_delta_rule.available_row_kernels(),
    "linear_error": float(((got - want).abs() / (want.abs() + 1)).max()),
}))
"""


def _report(cap: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), RVASCEND_MAX_ISA=cap)
    return subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True, env=env)


def _sets(report: dict) -> list[str]:
    return [s for family in ("linear", "quantized", "attention", "elementwise", "recurrent_gated_delta_rule")
            for s in report[family]]


def _native_report() -> dict:
    done = _report("native")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _native_and_capped(cap: str, needs: str) -> tuple[dict, dict]:
    """The reports without a cap and under RVASCEND_MAX_ISA=cap; skips a host without `needs`."""
    native = _native_report()
    if needs not in native["features"]:
        pytest.skip(f"this host has no {needs.removesuffix('=1')}")
    done = _report(cap)
    assert done.returncode == 0, done.stderr
    return native, json.loads(done.stdout)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX2 cap is an x86-64 one")
def test_avx2_cap_leaves_no_avx512_kernel_in_any_family():
    native, capped = _native_and_capped("avx2", "avx2=1")
    assert "avx512=0" in capped["features"] and "RVASCEND_MAX_ISA=avx2" in capped["features"]
    assert not [s for s in _sets(capped) if "avx512" in s], capped
    # Every family keeps its AVX2 kernels, first where the host had AVX-512 ones.
    assert capped["linear"][0] == "avx2" and capped["attention"][0] == "avx2", capped
    assert capped["quantized"][0] == "avx2" and capped["elementwise"][0] == "avx2", capped
    assert capped["recurrent_gated_delta_rule"][0].startswith("avx2"), capped
    assert capped["linear_error"] < 1e-2, capped  # BF16 output rounding, against FP64
    assert set(_sets(capped)) <= set(_sets(native))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX-512 cap is an x86-64 one")
def test_avx512_cap_drops_bf16_and_vnni_only():
    # A host with AVX-512 F/BW/VL but neither BF16 nor VNNI (Skylake-SP): what it runs.
    native, capped = _native_and_capped("avx512", "avx512=1")
    features = capped["features"]
    assert "avx512=1" in features and "avx512bf16=0" in features and "avx512vnni=0" in features, features
    assert "RVASCEND_MAX_ISA=avx512" in features
    assert "avx512bf16" not in capped["linear"] and "avx512vnni" not in capped["quantized"], capped
    assert capped["linear"][0] == "portable_avx512" and capped["attention"][0] == "avx512", capped
    assert capped["linear_error"] < 1e-2, capped
    assert set(_sets(capped)) <= set(_sets(native))


def test_generic_cap_runs_the_portable_kernels_only():
    done = _report("generic")
    assert done.returncode == 0, done.stderr
    capped = json.loads(done.stdout)
    assert "RVASCEND_MAX_ISA=generic" in capped["features"]
    vector = [s for s in _sets(capped) if any(isa in s for isa in ("avx", "rvv"))]
    assert not vector, capped
    assert capped["linear_error"] < 1e-2, capped


def test_unknown_cap_is_an_error_naming_the_variable():
    done = _report("avx9")
    assert done.returncode != 0
    assert "RVASCEND_MAX_ISA=avx9" in done.stderr and "expected native, avx2 or avx512" in done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The host extensions built from the one source list (toolchains/nix/host_extensions.json)
by the builder the flake calls, with this host's compiler: both modules import and run,
and a list short of a source fails at import (so a stale list cannot pass)."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys

import pytest

from rvascend import checkout
from rvascend.setup import host_extensions

_PROBE = """
import importlib.util, sys
def load(name):
    spec = importlib.util.spec_from_file_location(name, f"{sys.argv[1]}/{name}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
kernels = load("_rvv_kernels")
print(kernels.cpu_features(), kernels.available_kernel_sets(), load("_recurrent_gated_delta_rule").MAX_MTP)
"""


def _import(directory: str) -> subprocess.CompletedProcess:
    """Both modules loaded and called in a fresh interpreter (a module that fails to load
    would otherwise stay half-imported in this one)."""
    return subprocess.run([sys.executable, "-c", _PROBE, directory], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def manifest():
    return host_extensions.load_manifest(checkout.root())


def test_the_list_builds_both_extensions_and_they_run(manifest, tmp_path):
    made = host_extensions.build(manifest, checkout.root(), str(tmp_path))
    assert sorted(os.path.basename(m) for m in made) == ["_recurrent_gated_delta_rule.so", "_rvv_kernels.so"]
    done = _import(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "portable" in done.stdout and done.stdout.split()[-1] == "8"  # MAX_MTP


def test_a_list_short_of_a_source_fails_at_import(manifest, tmp_path):
    short = copy.deepcopy(manifest)
    name = "_recurrent_gated_delta_rule"
    objects = short["extensions"][name]["objects"]
    short["extensions"] = {name: short["extensions"][name]}
    source = "rvv_kernels/recurrent_gated_delta_rule/recurrent_gated_delta_rule_cpu.cc"
    del objects[[o["src"] for o in objects].index(source)]
    host_extensions.build(short, checkout.root(), str(tmp_path))
    spec = importlib.util.spec_from_file_location(name, os.path.join(tmp_path, name + ".so"))
    with pytest.raises(ImportError, match="undefined symbol"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))

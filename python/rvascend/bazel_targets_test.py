"""Every test file of the package is a Bazel test target: one left out of
python/BUILD.bazel would never run under `bazel test //...` (CI's command)."""

from __future__ import annotations

import os

from rvascend import checkout


def test_every_test_file_has_a_target():
    root = checkout.root()
    with open(os.path.join(root, "python", "BUILD.bazel"), encoding="utf-8") as f:
        build = f.read()
    package = os.path.join(root, "python")
    missing = []
    for directory, _, files in os.walk(os.path.join(package, "rvascend")):
        for name in files:
            if name.endswith("_test.py"):
                path = os.path.relpath(os.path.join(directory, name), package)
                if f'"{path}"' not in build:
                    missing.append(path)
    assert not missing, f"test files python/BUILD.bazel does not name: {sorted(missing)}"

"""The source checkout this package runs from, for the code that needs its files
(`.deps/`, the locks, git): set-up, the manifest, benchmarks, the default model.

Symlinks are resolved: under `bazel run` and `bazel test` this file is a runfiles
symlink into the checkout. None where the package is installed without one (the
riscv64 wheel on a board).
"""

from __future__ import annotations

import os
from typing import Optional


def _find() -> Optional[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    return root if os.path.exists(os.path.join(root, "WORKSPACE")) else None


ROOT: Optional[str] = _find()


def root() -> str:
    """ROOT, or a clear error where there is no checkout."""
    if ROOT is None:
        raise RuntimeError("this needs the rvascend source checkout (its .deps/ and locks); the package "
                           f"runs from {os.path.dirname(os.path.realpath(__file__))}, which is not one")
    return ROOT

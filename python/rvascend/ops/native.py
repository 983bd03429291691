"""Finds and loads the compiled extensions (`_rvv_kernels`, `_recurrent_gated_delta_rule`).

Under Bazel it sits next to this file (a runfile of //python:rvascend). In the
project venv `./dev setup` installs a copy into `rvascend/_native/`; a name
that Bazel does not build avoids a source file shadowing a build output.
"""

from __future__ import annotations

import glob
import importlib
import os
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


def _has_extension(directory: str, name: str) -> bool:
    return bool(glob.glob(os.path.join(directory, f"{name}*.so")))


def load_extension(name: str) -> ModuleType:
    """The compiled module `name` (e.g. "_rvv_kernels", "_recurrent_gated_delta_rule")."""
    if _has_extension(_HERE, name):
        return importlib.import_module(f"rvascend.ops.{name}")
    if _has_extension(os.path.join(os.path.dirname(_HERE), "_native"), name):
        return importlib.import_module(f"rvascend._native.{name}")
    raise ImportError(
        f"the rvascend extension {name} is not built: run `./dev setup`, "
        "or use it through Bazel (//python:rvascend)")


def load_rvv_kernels() -> ModuleType:
    return load_extension("_rvv_kernels")

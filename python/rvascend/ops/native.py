"""Finds and loads the compiled `_rvv_kernels` extension.

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


def _has_extension(directory: str) -> bool:
    return bool(glob.glob(os.path.join(directory, "_rvv_kernels*.so")))


def load_rvv_kernels() -> ModuleType:
    if _has_extension(_HERE):
        return importlib.import_module("rvascend.ops._rvv_kernels")
    if _has_extension(os.path.join(os.path.dirname(_HERE), "_native")):
        return importlib.import_module("rvascend._native._rvv_kernels")
    raise ImportError(
        "the rvascend kernel extension (_rvv_kernels) is not built: run `./dev setup`, "
        "or use it through Bazel (//python:rvascend)")

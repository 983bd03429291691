"""The llama.cpp peer as `./dev setup` left it in `.deps/llama_cpp` (rvascend/setup/
llama_cpp.py builds it): llama-cpp-python's interpreter, its quantizer, and the pinned
source distribution with the vendored llama.cpp (chat templates, the Hugging Face ->
GGUF converter, ggml's sources). Tests and benches read the peer through here; nothing
here builds or downloads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from typing import Any, Optional, Sequence

from rvascend import checkout

PYTHON_ENV = "RVASCEND_LLAMA_CPP_PYTHON"
SDIST_ENV = "RVASCEND_LLAMA_CPP_SDIST"
LOCK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup", "llama_cpp.lock.json")


def lock() -> dict[str, Any]:
    """The pins (llama-cpp-python's version, its source distribution and sha256)."""
    with open(LOCK, encoding="utf-8") as f:
        return json.load(f)


def work_dir() -> str:
    return os.path.join(checkout.root(), ".deps", "llama_cpp")


def sdist_path() -> str:
    """The pinned source distribution: $RVASCEND_LLAMA_CPP_SDIST or the one set-up fetched."""
    explicit = os.environ.get(SDIST_ENV)
    if explicit:
        return explicit
    path = os.path.join(work_dir(), lock()["sdist"])
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: run ./dev setup")
    return path


def python_path() -> str:
    """The built peer's interpreter: $RVASCEND_LLAMA_CPP_PYTHON or the set-up venv."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit
    python = os.path.join(work_dir(), f"venv-{lock()['version']}", "bin", "python")
    if not os.path.exists(python):
        raise FileNotFoundError(f"{python} is missing: run ./dev setup")
    return python


_QUANTIZE = r"""
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.nthread = 2
params.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""


def quantize(source: str, output: str, recipe: str) -> str:
    """llama.cpp's own quantizer (llama_model_quantize, its default recipe for `recipe`: Q4_K_M,
    Q5_K_M, IQ4_XS, ...) from the GGUF `source` (quantized sources are requantized) to `output`."""
    done = subprocess.run([python_path(), "-c", _QUANTIZE, source, output, recipe.upper()], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {recipe}: {done.stderr[-2000:]}")
    return output


def extract_vendored(dest: str, paths: Sequence[str], sdist: Optional[str] = None) -> str:
    """The vendored llama.cpp's files under `paths` (prefixes relative to its root),
    extracted from the source distribution `sdist` (default: sdist_path()) into `dest`;
    returns `dest`."""
    with tarfile.open(sdist or sdist_path()) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and any(m.name[len(prefix):].startswith(p) for p in paths)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(dest, members, filter="data")
    return dest


def converter_script(dest: str) -> str:
    """llama.cpp's Hugging Face -> GGUF converter (with its `conversion` package and its
    own gguf-py) extracted into `dest`; the script's path. It runs under this venv's
    interpreter (torch, transformers)."""
    extract_vendored(dest, ("convert_hf_to_gguf.py", "conversion/", "gguf-py/"))
    return os.path.join(dest, "convert_hf_to_gguf.py")

"""llama.cpp, the peer every comparison is measured against: llama-cpp-python built
from its PyPI source distribution (llama.cpp vendored), pinned with its sha256 in
llama_cpp.lock.json.

`./dev setup` downloads the source distribution into `.deps/llama_cpp` and builds
it into its own venv there (about eight minutes on two cores, once). The tests
read llama.cpp's tokenizer and logits through that venv's interpreter, and the
chat templates of the model families from the source distribution; the
benchmarks build ggml's RVV kernels from it. None of its code enters this
repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from typing import Any, Sequence

from absl import logging

from rvascend import checkout
from rvascend.runtime import pinned_download

PYTHON_ENV = "RVASCEND_LLAMA_CPP_PYTHON"
SDIST_ENV = "RVASCEND_LLAMA_CPP_SDIST"


def lock() -> dict[str, Any]:
    return pinned_download.load_lock(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_cpp.lock.json"))


def work_dir() -> str:
    return os.path.join(checkout.root(), ".deps", "llama_cpp")


def fetch_sdist(dest_dir: str) -> str:
    """The pinned source distribution in `dest_dir` (pip, hash-checked); its path."""
    spec = lock()
    return pinned_download.pip_download(spec["package"], spec["version"], spec["sdist_sha256"], spec["sdist"],
                                        dest_dir, source=True, size_hint="about 77 MB")


def sdist_path(fetch: bool = True) -> str:
    """The pinned source distribution: $RVASCEND_LLAMA_CPP_SDIST or .deps/llama_cpp."""
    explicit = os.environ.get(SDIST_ENV)
    if explicit:
        return explicit
    path = os.path.join(work_dir(), lock()["sdist"])
    if os.path.exists(path):
        return path
    if not fetch:
        raise FileNotFoundError(f"{path} is missing: run ./dev setup")
    return fetch_sdist(work_dir())


# The x86 builds the llama.cpp bench compares against: `native` is llama.cpp's own
# default (-march=native), `avx2` what an AVX2-only host runs (ggml's CMake options),
# for `llama_cpp_peer --isa=avx2` on an AVX-512 host.
ISA_CMAKE_ARGS = {
    "native": "",
    "avx2": "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
            "-DGGML_AVX512=OFF",
}
# -march=native on an Intel host with AMX compiles ggml's AMX buffer type in, and the pinned
# llama.cpp segfaults repacking Q4_1 tensors there (ggml_backend_amx_buffer_set_tensor)
# before its first token. GCC lets explicit -mno-* flags win over -march=native whatever their
# order, so every build leaves AMX out and runs on every x86 host class.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# The multimodal library (mtmd: vision and audio encoders) is a third of the build and no
# test or bench loads it; llama_cpp imports it only for a multimodal chat handler.
BUILD_CMAKE_ARGS = "-DLLAVA_BUILD=OFF"


def ensure_python(work: str, isa: str = "native") -> str:
    """The interpreter of a venv with the pinned llama-cpp-python, built from source once
    per `isa` (ISA_CMAKE_ARGS; its source distribution, which the tests read too, stays
    in `work`). The build's CMake options are these alone: a CMAKE_ARGS of the caller's
    environment is replaced (the stamp records what was built)."""
    if isa not in ISA_CMAKE_ARGS:
        raise ValueError(f"llama.cpp build {isa!r}: expected one of {', '.join(ISA_CMAKE_ARGS)}")
    spec = lock()
    sdist = fetch_sdist(work)
    venv = os.path.join(work, f"venv-{spec['version']}" + ("" if isa == "native" else f"-{isa}"))
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "INSTALLED")
    pinned = {k: spec[k] for k in ("package", "version", "sdist_sha256", "dependencies")}
    pinned["cflags"] = NO_AMX_FLAGS
    pinned["cmake_args"] = " ".join(filter(None, (BUILD_CMAKE_ARGS, ISA_CMAKE_ARGS[isa])))
    if os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if {k: v for k, v in json.load(f).items() if k in pinned} == pinned:
                logging.info("llama-cpp-python %s: already built in %s", spec["version"], venv)
                return python
    logging.info("llama-cpp-python %s: building llama.cpp (%s) from source into %s (about 8 minutes on 2 cores)",
                 spec["version"], isa, venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    pip = [python, "-m", "pip", "install", "--progress-bar", "off"]
    subprocess.run(pip + ["--no-deps", *spec["dependencies"]], check=True)
    # One compile job per core (CMake defaults to one job).
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(len(os.sched_getaffinity(0))),
           "CFLAGS": NO_AMX_FLAGS, "CXXFLAGS": NO_AMX_FLAGS, "CMAKE_ARGS": pinned["cmake_args"]}
    subprocess.run(pip + ["--no-deps", sdist], check=True, env=env)
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(pinned, f)
    return python


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


def extract_vendored(dest: str, paths: Sequence[str], fetch: bool = True) -> str:
    """The vendored llama.cpp's files under `paths` (prefixes relative to its root),
    extracted from the pinned source distribution into `dest`; returns `dest`."""
    with tarfile.open(sdist_path(fetch)) as tar:
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
    extract_vendored(dest, ("convert_hf_to_gguf.py", "conversion/", "gguf-py/"), fetch=False)
    return os.path.join(dest, "convert_hf_to_gguf.py")

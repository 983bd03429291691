"""llama.cpp, the peer every comparison is measured against: llama-cpp-python built
from its PyPI source distribution (llama.cpp vendored), pinned with its sha256 in
llama_cpp.lock.json.

`./dev setup` downloads the source distribution into `.deps/llama_cpp` and builds
it into its own venv there (about eight minutes on two cores, once). Tests and
benchmarks reach what it built through rvascend/testing/llama_cpp.py: llama.cpp's
tokenizer, logits and quantizer through that venv's interpreter, the chat templates
and ggml's sources from the source distribution. None of its code enters this
repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import logging

from rvascend.runtime import pinned_download
from rvascend.testing import llama_cpp as peer


def fetch_sdist(dest_dir: str) -> str:
    """The pinned source distribution in `dest_dir` (pip, hash-checked); its path."""
    spec = peer.lock()
    return pinned_download.pip_download(spec["package"], spec["version"], spec["sdist_sha256"], spec["sdist"],
                                        dest_dir, source=True, size_hint="about 77 MB")


def fetched_sdist() -> str:
    """The pinned source distribution, downloaded into .deps/llama_cpp if set-up has not."""
    try:
        return peer.sdist_path()
    except FileNotFoundError:
        return fetch_sdist(peer.work_dir())


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


def ensure_python(work: str | None = None, isa: str = "native") -> str:
    """The interpreter of a venv with the pinned llama-cpp-python, built from source once
    per `isa` (ISA_CMAKE_ARGS; its source distribution, which the tests read too, stays
    in `work`, by default .deps/llama_cpp). The build's CMake options are these alone: a
    CMAKE_ARGS of the caller's environment is replaced (the stamp records what was built)."""
    if isa not in ISA_CMAKE_ARGS:
        raise ValueError(f"llama.cpp build {isa!r}: expected one of {', '.join(ISA_CMAKE_ARGS)}")
    work = work or peer.work_dir()
    spec = peer.lock()
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

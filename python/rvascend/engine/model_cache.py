"""The project's cache of generated and converted checkpoints (~/.cache/rvascend)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

from absl import logging


def cache_root() -> str:
    """RVASCEND_CACHE_DIR, else the user cache; a read-only home (a Bazel test
    sandbox) falls back to the test's or the system's temporary directory."""
    base = os.environ.get("RVASCEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rvascend")
    try:
        os.makedirs(base, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=base).close()
        return base
    except OSError:
        return os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.gettempdir(), "rvascend")


def ensure_checkpoint(name: str, write: Callable[[str], None], what: str) -> str:
    """The cached checkpoint directory `name`, made by `write(directory)` on first use.

    The entry is written into a temporary directory and renamed into place, so an
    interrupted run never leaves a half-written checkpoint behind."""
    path = os.path.join(cache_root(), name)
    if os.path.isdir(path):  # entries appear by an atomic rename, whole
        return path
    logging.info("writing %s into %s (first use)", what, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=f".{name}-")
    try:
        write(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path

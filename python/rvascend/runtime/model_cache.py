"""The project's cache of generated and converted checkpoints (~/.cache/rvascend)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import Callable

from absl import logging


def cache_root() -> str:
    """RVASCEND_CACHE_DIR, else the user cache; a read-only home (a Bazel test
    sandbox) falls back to the test's temporary directory, else to a directory of
    this user's own under the system's temporary directory. The root is private
    (0700) and must be this user's: what it holds (converted checkpoints, the
    default model, gate tables) is read back as trusted, so a shared, predictable
    path such as /tmp/rvascend would let another user plant a model."""
    base = os.environ.get("RVASCEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rvascend")
    try:
        _private_dir(base)
        tempfile.NamedTemporaryFile(dir=base).close()
        return base
    except UnsafeCacheError:
        raise
    except OSError:
        fallback = os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.gettempdir(), f"rvascend-{os.getuid()}")
        _private_dir(fallback)
        return fallback


def _private_dir(path: str) -> None:
    """Makes `path` (mode 0700) or checks the one there: a directory (not a link) this
    user owns that no one else may write to; UnsafeCacheError otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"the cache directory {path} is not a directory (a link or a file is there)")
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(f"the cache directory {path} belongs to uid {st.st_uid}, not to this user "
                               f"({os.getuid()}): set RVASCEND_CACHE_DIR to a directory of your own")
    if st.st_mode & 0o022:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)


class UnsafeCacheError(OSError):
    """The cache directory is not this user's alone."""


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

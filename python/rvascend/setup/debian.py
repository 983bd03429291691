"""Debian packages of the host and the machine's configured apt mirror."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from typing import Iterable, Sequence

from absl import logging


class SetupError(RuntimeError):
    """A set-up step could not be completed; the message names what and why."""


def run_step(cmd: Sequence[str], cwd: str | None = None) -> None:
    """Runs one command of a set-up step with its output captured; a failure is a SetupError
    that shows the command and the end of its output."""
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SetupError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def apt_mirror_uri(sources_dir: str = "/etc/apt") -> str:
    """The first Debian archive URI in the machine's apt configuration.

    Read at run time so the repository never names a mirror host. Both the
    deb822 `.sources` format and one-line `sources.list` entries are read;
    security and ports archives are skipped.
    """
    candidates: list[str] = []
    for path in sorted(glob.glob(os.path.join(sources_dir, "sources.list.d", "*.sources"))):
        with open(path, encoding="utf-8") as f:
            for stanza in f.read().split("\n\n"):
                if re.search(r"^Enabled:\s*no", stanza, re.M | re.I):
                    continue
                m = re.search(r"^URIs:\s*(.+)$", stanza, re.M)
                if m:
                    candidates.extend(m.group(1).split())
    lists = [os.path.join(sources_dir, "sources.list")]
    lists += sorted(glob.glob(os.path.join(sources_dir, "sources.list.d", "*.list")))
    for path in lists:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
                if m:
                    candidates.append(m.group(1))
    for uri in candidates:
        if "security" in uri or "ports" in uri:
            continue
        return uri.rstrip("/")
    raise SetupError(
        f"no Debian archive URI found in {sources_dir}/sources.list(.d); "
        "configure apt before running set-up")


def missing_packages(packages: Iterable[str]) -> list[str]:
    """Packages from `packages` that dpkg does not report as installed."""
    missing = []
    for name in packages:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name],
            capture_output=True, text=True, check=False)
        if "install ok installed" not in result.stdout:
            missing.append(name)
    return missing


def ensure_packages(packages: Sequence[str]) -> None:
    """Installs whichever of `packages` is missing (apt-get update first)."""
    if shutil.which("dpkg-query") is None:
        raise SetupError("this set-up needs a Debian system (dpkg-query not found)")
    missing = missing_packages(packages)
    if not missing:
        logging.info("Debian packages: all %d present", len(packages))
        return
    logging.info("Debian packages: installing %s", " ".join(missing))
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-q"], check=True, env=env)
    result = subprocess.run(
        sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        env=env, check=False)
    still_missing = missing_packages(missing)
    if result.returncode != 0 or still_missing:
        raise SetupError(
            "apt-get could not install: " + " ".join(still_missing or missing))

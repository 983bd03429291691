"""Lock files of Debian packages (name, version, pool file, sha256) and their use.

A lock pins exact .deb files of one suite and architecture. Set-up downloads
exactly those files from the machine's configured mirror, refuses any whose
sha256 differs, and unpacks them. Only `regenerate` (run on purpose, by
`./dev lock`) reads the archive's current index and rewrites a lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
import os
import subprocess
import urllib.request
from typing import Iterable, Optional

from absl import logging

from rvascend.setup.debian import SetupError, apt_mirror_uri
from rvascend.runtime.pinned_download import sha256_file


@dataclasses.dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    filename: str
    size: int
    sha256: str


@dataclasses.dataclass
class DebianLock:
    suite: str
    architecture: str
    packages: list[LockedPackage]
    comment: str = ""

    @classmethod
    def load(cls, path: str) -> "DebianLock":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        return cls(
            suite=raw["suite"], architecture=raw["architecture"],
            packages=[LockedPackage(**p) for p in raw["packages"]],
            comment=raw.get("comment", ""))

    def save(self, path: str) -> None:
        raw = {"comment": self.comment, "suite": self.suite,
               "architecture": self.architecture,
               "packages": [dataclasses.asdict(p) for p in self.packages]}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=2)
            f.write("\n")

    def digest(self) -> str:
        """sha256 over the locked (name, version, sha256) triples: the lock's identity."""
        h = hashlib.sha256()
        for p in sorted(self.packages, key=lambda p: p.name):
            h.update(f"{p.name} {p.version} {p.sha256}\n".encode())
        return h.hexdigest()


def _download(url: str, dest: str) -> None:
    tmp = dest + ".part"
    with urllib.request.urlopen(url, timeout=120) as response, open(tmp, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done = 0
        next_report = 0.25
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
            done += len(chunk)
            if total and done / total >= next_report:
                logging.info("  %s: %3.0f%% of %.1f MB", os.path.basename(dest),
                             100 * done / total, total / 1e6)
                next_report += 0.25
    os.replace(tmp, dest)


def fetch(lock: DebianLock, cache_dir: str, mirror: Optional[str] = None) -> list[str]:
    """Downloads every locked .deb into `cache_dir`, verified; returns their paths."""
    os.makedirs(cache_dir, exist_ok=True)
    paths = []
    base = mirror
    for pkg in lock.packages:
        dest = os.path.join(cache_dir, os.path.basename(pkg.filename))
        if os.path.exists(dest) and sha256_file(dest) == pkg.sha256:
            paths.append(dest)
            continue
        base = base or apt_mirror_uri()  # read once, and only when something is missing
        url = f"{base}/{pkg.filename}"
        logging.info("downloading %s %s", pkg.name, pkg.version)
        try:
            _download(url, dest)
        except OSError as e:
            raise SetupError(
                f"could not download {pkg.name} {pkg.version} from the configured mirror "
                f"({e}); if the archive dropped this version, regenerate the lock on "
                f"purpose with `./dev lock`") from e
        actual = sha256_file(dest)
        if actual != pkg.sha256:
            os.remove(dest)
            raise SetupError(
                f"{pkg.name} {pkg.version}: sha256 {actual} does not match the lock's "
                f"{pkg.sha256}; refusing to use it")
        paths.append(dest)
    return paths


def extract(deb_paths: Iterable[str], root: str) -> None:
    """Unpacks .deb files into `root` without running maintainer scripts."""
    os.makedirs(root, exist_ok=True)
    for deb in deb_paths:
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)


def _parse_packages_index(text: str) -> dict[str, dict[str, str]]:
    index: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if "Package" in fields:
            index[fields["Package"]] = fields
    return index


def read_packages_index(suite: str, architecture: str, mirror: Optional[str] = None,
                        component: str = "main") -> dict[str, dict[str, str]]:
    base = mirror or apt_mirror_uri()
    url = f"{base}/dists/{suite}/{component}/binary-{architecture}/Packages.xz"
    logging.info("reading the %s/%s package index", suite, architecture)
    with urllib.request.urlopen(url, timeout=300) as response:
        return _parse_packages_index(lzma.decompress(response.read()).decode("utf-8"))


def resolve_closure(suite: str, architecture: str, names: Iterable[str],
                    mirror: Optional[str] = None) -> list[str]:
    """`names` and everything they depend on (no recommends), as apt resolves it
    for an empty system of that suite and architecture."""
    import tempfile

    base = mirror or apt_mirror_uri()
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("state/lists/partial", "cache/archives/partial"):
            os.makedirs(os.path.join(tmp, d))
        open(os.path.join(tmp, "state", "status"), "w").close()
        with open(os.path.join(tmp, "sources.list"), "w") as f:
            f.write(f"deb [arch={architecture} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                    f"{base} {suite} main\n")
        opts = [f"-oDir::Etc::SourceList={tmp}/sources.list", "-oDir::Etc::SourceParts=/dev/null",
                f"-oDir::State={tmp}/state", f"-oDir::State::status={tmp}/state/status",
                f"-oDir::Cache={tmp}/cache", f"-oAPT::Architecture={architecture}",
                f"-oAPT::Architectures::={architecture}", "-oDir::Etc::Preferences=/dev/null",
                "-oDir::Etc::PreferencesParts=/dev/null"]
        subprocess.run(["apt-get", *opts, "update", "-qq"], check=True)
        sim = subprocess.run(["apt-get", *opts, "install", "-s", "-qq", "--no-install-recommends", *names],
                             check=True, capture_output=True, text=True).stdout
    return sorted({line.split()[1] for line in sim.splitlines() if line.startswith("Inst ")})


def regenerate(lock: DebianLock, names: Iterable[str],
               index: Optional[dict[str, dict[str, str]]] = None) -> DebianLock:
    """A new lock with the archive's current version of every package in `names`."""
    index = index if index is not None else read_packages_index(lock.suite, lock.architecture)
    packages = []
    for name in names:
        if name not in index:
            raise SetupError(f"package {name} is not in {lock.suite}/{lock.architecture}")
        f = index[name]
        packages.append(LockedPackage(name=name, version=f["Version"], filename=f["Filename"],
                                      size=int(f["Size"]), sha256=f["SHA256"]))
    return DebianLock(suite=lock.suite, architecture=lock.architecture,
                      packages=packages, comment=lock.comment)

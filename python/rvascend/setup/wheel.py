"""Builds the rvascend wheel for one platform, byte for byte reproducibly.

  bazel build //python:wheel_riscv64   ->  rvascend-<version>-cp313-cp313-linux_riscv64.whl

The wheel holds what a board runs: the package's serving layers (benchmarks,
build tooling, manifests and tests left out) and the extensions built for that
platform. Reproducible by construction: entries in
sorted order, every timestamp 1980-01-01, fixed permissions, fixed
compression, and RECORD listing each file's sha256.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile
from typing import Iterable

from absl import app, flags

_EPOCH = (1980, 1, 1, 0, 0, 0)


# What a board does not run: the benchmarks, the set-up and build tooling, the
# reproducibility manifests (all import the serving layers, never the reverse:
# rvascend/layering_test.py), what tests and benchmarks share (testing/, which no
# serving layer imports) and each layer's test helpers. They stay in the source tree.
DEV_SUBPACKAGES = ("bench", "setup", "repro", "testing")
TEST_HELPERS = ("testing.py",)


def _sources(package_dir: str) -> Iterable[tuple[str, str]]:
    """(path inside the wheel, file) for the package's Python files a board runs (tests,
    test helpers and DEV_SUBPACKAGES left out) and the data files they read (*.json: pins
    and the measured shape gate's table)."""
    package_dir = os.path.abspath(package_dir)
    root = os.path.dirname(package_dir)
    for dirpath, dirnames, filenames in os.walk(package_dir):
        skip = ("__pycache__", "_native") + (DEV_SUBPACKAGES if dirpath == package_dir else ())
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            if name.endswith((".py", ".json")) and not name.endswith("_test.py") and name not in TEST_HELPERS:
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root), path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(package_dir: str, extensions: list[str], version: str, python_tag: str, platform: str,
                output_dir: str) -> str:
    """Writes the wheel into output_dir and returns its path."""
    name = f"rvascend-{version}-{python_tag}-{python_tag}-{platform}.whl"
    dist_info = f"rvascend-{version}.dist-info"
    files: dict[str, bytes] = {}
    for arcname, path in _sources(package_dir):
        with open(path, "rb") as f:
            files[arcname] = f.read()
    for ext in extensions:
        with open(ext, "rb") as f:
            files[f"rvascend/ops/{os.path.basename(ext)}"] = f.read()
    files[f"{dist_info}/METADATA"] = (
        "Metadata-Version: 2.1\nName: rvascend\nVersion: " + version + "\n"
        "Summary: Hand-written RVV and Ascend kernels for LLM inference, with a CPU serving engine\n"
        "Requires-Python: >=3.11\nRequires-Dist: torch\nRequires-Dist: safetensors\nRequires-Dist: absl-py\n"
        "Requires-Dist: fastapi\nRequires-Dist: uvicorn\nRequires-Dist: prometheus-client\n"
        "Requires-Dist: jinja2\nRequires-Dist: psutil\nRequires-Dist: regex\nRequires-Dist: llguidance==1.9.1\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: rvascend.setup.wheel\nRoot-Is-Purelib: false\n"
        f"Tag: {python_tag}-{python_tag}-{platform}\n").encode()
    files[f"{dist_info}/top_level.txt"] = b"rvascend\n"
    record = "".join(f"{arc},{_digest(data)},{len(data)}\n" for arc, data in sorted(files.items()))
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    os.makedirs(output_dir, exist_ok=True)
    out = os.path.join(output_dir, name)
    with zipfile.ZipFile(out, "w") as zf:
        for arcname in sorted(files):
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o755 if arcname.endswith(".so") else 0o644) << 16
            info.create_system = 3  # Unix, whatever the build host
            zf.writestr(info, files[arcname], compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return out


FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_string("package_dir", None, "The rvascend package directory.")
    flags.DEFINE_list("extensions", [], "Compiled extensions for the platform (placed in rvascend/ops/).")
    flags.DEFINE_string("version", None, "Version (default: rvascend.__version__ read from the package).")
    flags.DEFINE_string("python_tag", "cp313", "Python tag.")
    flags.DEFINE_string("platform", "linux_riscv64", "Platform tag.")
    flags.DEFINE_string("output", None, "Where the wheel goes (a file path; its name must match the tags).")


def _package_version(package_dir: str) -> str:
    with open(os.path.join(package_dir, "__init__.py"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
    raise ValueError(f"{package_dir}/__init__.py has no __version__")


def main(argv: list[str]) -> int:
    del argv
    version = FLAGS.version or _package_version(FLAGS.package_dir)
    path = build_wheel(FLAGS.package_dir, FLAGS.extensions, version, FLAGS.python_tag, FLAGS.platform,
                       os.path.dirname(os.path.abspath(FLAGS.output)))
    if os.path.abspath(path) != os.path.abspath(FLAGS.output):
        os.replace(path, FLAGS.output)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

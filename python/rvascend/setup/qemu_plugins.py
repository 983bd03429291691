"""QEMU 10's riscv64 user-mode emulator with TCG plugins, built from Debian 13's source.

The counting benches need both an emulator that runs Zvfh (llama.cpp's RVV kernels
use half-precision vector instructions, which Debian 12's QEMU 7.2 lacks) and one
that loads plugins (the instruction counter). Debian 13's qemu-user is static and
cannot load plugins, so the same upstream release is built here with them: one
target (riscv64-linux-user), no system emulation, no tools, about 2 minutes on
two cores, once per checkout (.deps/qemu_plugins).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile

from absl import logging

from rvascend import checkout
from rvascend.setup import debian, debian_lock

LOCK = os.path.join(checkout.root(), "toolchains", "qemu", "qemu_source.lock.json")
# Host packages the build needs (Debian 12): glib's headers and the build tools.
BUILD_PACKAGES = ("libglib2.0-dev", "ninja-build", "pkg-config", "flex", "bison", "python3-venv")
# Debian's source drops the meson wheel upstream bundles; configure takes it from a build venv.
BUILD_PYTHON_PACKAGES = ("meson==1.5.0", "pycotap==1.3.1")
CONFIGURE = ("--target-list=riscv64-linux-user", "--enable-plugins", "--disable-system", "--disable-tools",
             "--disable-docs", "--disable-install-blobs", "--disable-werror", "--disable-capstone", "--without-default-features")


def emulator(deps_dir: str) -> str:
    """The plugin-capable qemu-riscv64, built first if this checkout has none of this lock."""
    lock = debian_lock.DebianLock.load(LOCK)
    root = os.path.join(deps_dir, "qemu_plugins")
    binary = os.path.join(root, "bin", "qemu-riscv64")
    stamp = os.path.join(root, "INSTALLED")
    if os.path.exists(binary) and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read().strip() == lock.digest():
                return binary
    debian.ensure_packages(BUILD_PACKAGES)
    (tarball,) = debian_lock.fetch(lock, os.path.join(deps_dir, "downloads"))
    work = os.path.join(deps_dir, "qemu_plugins_build")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    logging.info("QEMU with plugins: unpacking %s", os.path.basename(tarball))
    with tarfile.open(tarball) as tar:
        tar.extractall(work, filter="tar")
    (source,) = [os.path.join(work, d) for d in os.listdir(work)]
    build = os.path.join(source, "build")
    os.makedirs(build)
    venv = os.path.join(work, "venv")
    python = os.path.join(venv, "bin", "python3")
    debian.run_step([sys.executable, "-m", "venv", venv])
    debian.run_step([python, "-m", "pip", "install", "-q", *BUILD_PYTHON_PACKAGES])
    logging.info("QEMU with plugins: configuring and building riscv64-linux-user (about 2 minutes)")
    debian.run_step([os.path.join(source, "configure"), f"--prefix={root}", f"--python={python}", *CONFIGURE],
                    cwd=build)
    debian.run_step(["ninja", "-j", str(len(os.sched_getaffinity(0))), "qemu-riscv64"], cwd=build)
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    shutil.copy(os.path.join(build, "qemu-riscv64"), binary)
    with open(stamp, "w") as f:
        f.write(lock.digest() + "\n")
    shutil.rmtree(work, ignore_errors=True)
    logging.info("QEMU with plugins: %s", binary)
    return binary



def count_plugin() -> str:
    """The counting plugin (bench/qemu_count_plugin.cc), built with Bazel."""
    from rvascend.setup import steps

    return os.path.join(steps.bazel_bin(["//python:qemu_count_plugin.so"]), "python", "qemu_count_plugin.so")

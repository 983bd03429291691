"""The server from the riscv64 wheel inside the riscv64 image under QEMU: what a
RISC-V board runs, on any x86-64 machine (`./dev serve --riscv64`, and the wheel test).

QEMU user mode shares the host's file system and loopback, so the guest reads
the checkpoint from the host's path and the host reaches the guest's port.
Emulated, it is slow (importing torch alone takes about 30 s): for trying the
exact build a board runs, not for measuring speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from typing import Optional, Sequence

from absl import logging


def qemu_cpu(vlen: int, vector: bool = True) -> str:
    return f"rv64,v=true,vext_spec=v1.0,vlen={vlen}" if vector else "rv64,v=false"


def guest_command(qemu: str, image: str, cpu: str, args: Sequence[str]) -> list[str]:
    return [qemu, "-L", image, "-cpu", cpu, os.path.join(image, "usr", "bin", "python3.13"), *args]


BOARD_WHEELS_LOCK = os.path.join("toolchains", "riscv64_image", "board_wheels.lock.json")


def board_wheels(deps_dir: str, fetch: bool = False) -> list[str]:
    """The pinned riscv64 wheels rvascend needs beside the image's Debian packages
    (llguidance), in `deps_dir`/board_wheels: fetched there with pip when `fetch`."""
    from rvascend import checkout
    from rvascend.runtime import pinned_download

    with open(os.path.join(checkout.root(), BOARD_WHEELS_LOCK), encoding="utf-8") as f:
        pins = json.load(f)["wheels"]
    dest = os.path.join(deps_dir, "board_wheels")
    paths = []
    for pin in pins:
        path = os.path.join(dest, pin["file"])
        if fetch:
            path = pinned_download.pip_download(pin["package"], pin["version"], pin["sha256"], pin["file"], dest,
                                                source=False, size_hint="riscv64 wheel", platform=pin["platform"])
        elif not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: ./dev setup fetches the board's pinned wheels")
        paths.append(path)
    return paths


def install_wheel(qemu: str, image: str, wheel: str, site: str, extra_wheels: Sequence[str] = ()) -> str:
    """Installs `wheel` and `extra_wheels` (board_wheels) with the image's own pip (offline,
    --no-deps) into `site`; skipped when `site` already holds these exact wheels. Returns `site`."""
    digest = hashlib.sha256()
    for path in (wheel, *extra_wheels):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest = digest.hexdigest()
    stamp = os.path.join(site, ".rvascend-wheel-sha256")
    if os.path.exists(stamp) and open(stamp).read().strip() == digest:
        return site
    shutil.rmtree(site, ignore_errors=True)
    os.makedirs(site)
    logging.info("installing %s into %s with the image's pip under QEMU", os.path.basename(wheel), site)
    cmd = guest_command(qemu, image, qemu_cpu(256), [
        "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--disable-pip-version-check",
        "--target", site, wheel, *extra_wheels])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install of the wheel failed in the image:\n{proc.stdout}\n{proc.stderr}")
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    return site


def server_process(qemu: str, image: str, site: str, server_args: Sequence[str], vlen: int = 256,
                   vector: bool = True, log: Optional[str] = None) -> subprocess.Popen:
    """Starts `python3 -m rvascend.server ARGS` from the installed wheel under QEMU."""
    env = dict(os.environ, PYTHONPATH=site, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    out = open(log, "w") if log else None
    return subprocess.Popen(guest_command(qemu, image, qemu_cpu(vlen, vector), ["-m", "rvascend.server",
                                                                                 *server_args]),
                            env=env, stdout=out, stderr=subprocess.STDOUT if out else None)

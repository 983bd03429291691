"""Running a tool of the pinned toolchain root (Debian 13: clang-19, GCC 14 for riscv64)
outside Bazel, the way the Bazel wrappers do (toolchains/roots/toolchain_root_repository.bzl):
inside bubblewrap, with the root's /usr and /etc as the whole file system and the
given host directories bound at their own paths."""

from __future__ import annotations

import os
from typing import Sequence

from rvascend import checkout


def root_dir() -> str:
    """The unpacked toolchain root of this checkout (`./dev setup` unpacks it)."""
    return os.path.join(checkout.root(), ".deps", "toolchain_root")


def command(tool: str, args: Sequence[str], binds: Sequence[str], chdir: str, root: str | None = None) -> list[str]:
    """argv that runs `tool` (a path inside the root) with `args`, `binds` read-write."""
    root = root or root_dir()
    cmd = ["bwrap", "--tmpfs", "/", "--ro-bind", f"{root}/usr", "/usr", "--ro-bind", f"{root}/etc", "/etc",
           "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin"]
    for path in binds:
        cmd += ["--bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--chdir", chdir, "--setenv", "PATH", "/usr/bin:/bin", tool]
    return cmd + list(args)


def wrapper_script(tool: str, binds: Sequence[str], root: str | None = None) -> str:
    """A shell script that runs `tool` in the root with the script's arguments, from the
    caller's directory (which must lie under one of `binds`): a compiler for CMake."""
    argv = command(tool, [], binds, "__CWD__", root)
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv).replace("'__CWD__'", '"$PWD"')
    return f"#!/bin/sh\nexec {quoted} \"$@\"\n"

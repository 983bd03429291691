"""The host extensions (_rvv_kernels, _recurrent_gated_delta_rule) built without Bazel, from one source list.

Nix builds the package without Bazel (flake.nix's `kernels`), and a hand-kept list of
sources there went stale as kernels came and went. The list is now made from Bazel's
own compile actions (`--write`: `bazel aquery` of the two extension targets, into
toolchains/nix/host_extensions.json, each source with the defines and ISA flags its
library builds it with), and one builder compiles and links it: the flake calls it with
clang++, and host_extensions_test builds it with the host's compiler and imports both
modules, so a source the list lacks fails the suite (an undefined symbol at import).

  python -m rvascend.setup.host_extensions --write            # refresh the list (Bazel)
  python -m rvascend.setup.host_extensions --out DIR [--cxx clang++]
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from typing import Any

from absl import app, flags, logging

MANIFEST = os.path.join("toolchains", "nix", "host_extensions.json")
TARGETS = {"_rvv_kernels": "//python:rvascend/ops/_rvv_kernels.so",
           "_recurrent_gated_delta_rule": "//python:rvascend/ops/_recurrent_gated_delta_rule.so"}
# What every object and link gets; the per-source flags come from the manifest.
COMMON_FLAGS = ["-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG"]
# Of a Bazel compile line, what says how a source is built (not where Bazel keeps things).
_KEPT_PREFIXES = ("-D", "-m", "-O", "-Wno-", "-ffp-contract")
_BAZEL_DEFINES = ('-D__DATE__="redacted"', '-D__TIMESTAMP__="redacted"', '-D__TIME__="redacted"', "-DNDEBUG")


def _actions(target: str, mnemonic: str, root: str) -> list[dict[str, Any]]:
    done = subprocess.run(["bazel", "aquery", f'mnemonic("{mnemonic}", deps({target}))', "--output=jsonproto"],
                          cwd=root, capture_output=True, text=True, check=True)
    return json.loads(done.stdout).get("actions", [])


def _source_includes(args: list[str]) -> list[str]:
    """The source-tree include directories of a compile line (Bazel's output and external
    directories are its own; the builder supplies Python's and pybind11's)."""
    out = []
    for flag, value in zip(args, args[1:]):
        if flag in ("-iquote", "-isystem", "-I") and not value.startswith(("bazel-out", "external")) \
                and value != ".":
            out.append(value)
    return out


def manifest_from_bazel(root: str) -> dict[str, Any]:
    """Every extension's objects (source, flags, include directories) and link flags, from
    Bazel's actions for the host."""
    extensions = {}
    for name, target in TARGETS.items():
        objects: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        for action in _actions(target, "CppCompile", root):
            args = action["arguments"]
            source = next(a for a in args if a.endswith((".cc", ".cpp")))
            kept = tuple(a for a in args if a.startswith(_KEPT_PREFIXES) and a not in _BAZEL_DEFINES
                         and a != "-O2")  # Bazel's default, overridden by each library's -O3
            objects.setdefault((source, kept), {"src": source, "flags": list(kept),
                                                "includes": sorted(set(_source_includes(args)))})
        link = []
        for action in _actions(target, "CppLink", root):
            link += [a for a in action["arguments"] if a.startswith("-l") or a == "-Wl,--no-as-needed"]
        extensions[name] = {"objects": sorted(objects.values(), key=lambda o: (o["src"], o["flags"])),
                            "link": list(dict.fromkeys(link))}
    return {"generated_by": "python -m rvascend.setup.host_extensions --write", "extensions": extensions}


def _python_includes() -> list[str]:
    import pybind11

    return [f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}"]


def build(manifest: dict[str, Any], root: str, out: str, cxx: str = "c++", jobs: int = 0) -> list[str]:
    """Compiles and links every extension of `manifest` (sources relative to `root`) into
    `out`; the paths of the modules made."""
    os.makedirs(out, exist_ok=True)
    includes = [f"-I{root}", *_python_includes()]
    made = []
    with concurrent.futures.ThreadPoolExecutor(jobs or len(os.sched_getaffinity(0))) as pool:
        for name, extension in manifest["extensions"].items():
            commands = []
            for i, obj in enumerate(extension["objects"]):
                target = os.path.join(out, f"{name}.{i}.o")
                commands.append((target, [cxx, *COMMON_FLAGS, *obj["flags"], *includes,
                                          *(f"-I{os.path.join(root, d)}" for d in obj["includes"]),
                                          "-c", os.path.join(root, obj["src"]), "-o", target]))
            list(pool.map(_run, [c for _, c in commands]))  # raises the first failure
            module = os.path.join(out, f"{name}.so")
            _run([cxx, "-shared", "-o", module, *(t for t, _ in commands), *extension["link"]])
            made.append(module)
            logging.info("built %s from %d objects", module, len(commands))
    return made


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stderr[-4000:]}")


def load_manifest(root: str) -> dict[str, Any]:
    with open(os.path.join(root, MANIFEST), encoding="utf-8") as f:
        return json.load(f)


FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_bool("write", False, f"Refresh {MANIFEST} from Bazel's compile actions.")
    flags.DEFINE_string("out", None, "Build the extensions into this directory.")
    flags.DEFINE_string("cxx", "c++", "The C++ compiler.")
    flags.DEFINE_string("root", os.getcwd(), "The source checkout.")


def main(argv: list[str]) -> int:
    del argv
    if FLAGS.write:
        with open(os.path.join(FLAGS.root, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest_from_bazel(FLAGS.root), f, indent=1)
            f.write("\n")
    if FLAGS.out:
        build(load_manifest(FLAGS.root), FLAGS.root, FLAGS.out, FLAGS.cxx)
    if not FLAGS.write and not FLAGS.out:
        print("nothing to do: --write and/or --out DIR", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main)

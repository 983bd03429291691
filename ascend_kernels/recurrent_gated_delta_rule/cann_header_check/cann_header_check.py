"""Type-check the AscendC kernel and op_host sources against CANN's public headers.

No CANN compiler or NPU is needed: clang parses the sources with -fsyntax-only
against a checkout of asc-devkit (the AscendC API headers) and of metadef (the
op-registration headers), in device mode for the 910B vector core
(__NPU_ARCH__ 2201, a vector-core build: __DAV_VEC__, __DAV_C220_VEC__ in older
trees). What bisheng itself provides is stood in by `cann_standin.h` (names
only) and `host_standin/`.

The tiling header is made as CANN's build makes it: `kernel_tiling/kernel_tiling.h`
by the devkit's own gen_kernel_tiling_data_def.py, the struct the kernel
registers with REGISTER_TILING_DEFAULT found by a precompile pass
(__CHECK_FEATURE_AT_PRECOMPILE), and its GET_TILING_DATA macros by the devkit's
own generator (gen_dynamic_shape_v2 in asc_op_compiler/get_op_tiling.py).

Fails on any error (except the known stand-in artefacts below, matched by exact
message) and on any warning located in the project's own sources.

  bazel run //ascend_kernels/recurrent_gated_delta_rule:cann_header_check
  (ASC_DEVKIT and METADEF name the checkouts; see the kernel's README)
"""

from __future__ import annotations

import __future__
import ast
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from absl import app, flags, logging

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_DIR = os.path.join(os.path.dirname(HERE), "op_kernel")
OP_HOST_DIR = os.path.join(os.path.dirname(HERE), "op_host")
KERNEL_SOURCE = "recurrent_gated_delta_rule.cpp"
OP_TYPE = "recurrent_gated_delta_rule"
# op_host sources, and whether each needs metadef's op_def_registry.h (public
# in metadef from v9.1.0-beta.1; older CANN shipped it elsewhere).
OP_HOST_SOURCES = {
    "recurrent_gated_delta_rule_def.cpp": True,
    "recurrent_gated_delta_rule_infershape.cpp": False,
    "recurrent_gated_delta_rule_tiling.cpp": False,
    "recurrent_gated_delta_rule_tiling_register.cpp": False,
}
DTYPES = {"bf16": "bfloat16_t", "fp16": "half"}
# (file name, exact message, why it is not the kernel's fault)
KNOWN_ARTEFACTS = [
    ("asc_aicore_dump_impl.h", "redefinition of 'asc_dump'",
     "overloads that differ only in their address space, which the stand-in's empty __gm__/__ubuf__ erase"),
]
# Warnings that must not appear in the project's own sources.
WARNINGS = ["-Wall", "-Wextra", "-Wimplicit-int-conversion", "-Wshorten-64-to-32"]
_DIAGNOSTIC = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (?P<kind>fatal error|error|warning): "
                         r"(?P<message>.*)$")
_REGISTERED_TILING = re.compile(r"auto\s+__enable_custom_tiling\s+([\w:]+)\s*=\s*default\b")


@dataclasses.dataclass
class Diagnostic:
    file: str
    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind}: {self.message}"


@dataclasses.dataclass
class Unit:
    name: str
    failures: list[Diagnostic]
    filtered: list[Diagnostic]
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


class CheckError(RuntimeError):
    """The check could not run (a checkout or a tool is missing or unusable)."""


def parse_diagnostics(stderr: str) -> list[Diagnostic]:
    out = []
    for line in stderr.splitlines():
        m = _DIAGNOSTIC.match(line)
        if m:
            out.append(Diagnostic(m["file"], int(m["line"]), m["kind"], m["message"]))
    return out


def classify(diagnostics: list[Diagnostic], own_dirs: list[str]) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """(failures, filtered artefacts): every error but a known artefact, and warnings in own_dirs."""
    # Paths as clang was given them (runfiles are symlinks: no realpath).
    own = [os.path.abspath(d) + os.sep for d in own_dirs]
    failures, filtered = [], []
    for d in diagnostics:
        if d.kind == "warning":
            if any(os.path.abspath(d.file).startswith(o) for o in own):
                failures.append(d)
            continue
        if any(os.path.basename(d.file) == f and d.message == m for f, m, _ in KNOWN_ARTEFACTS):
            filtered.append(d)
        else:
            failures.append(d)
    return failures, filtered


def registered_tiling_struct(preprocessed: str) -> str:
    """The struct the kernel registers with REGISTER_TILING_DEFAULT, from its precompile expansion."""
    found = set(_REGISTERED_TILING.findall(preprocessed))
    if len(found) != 1:
        raise CheckError(f"expected one REGISTER_TILING_DEFAULT struct in the kernel, found {sorted(found) or 'none'}")
    return found.pop()


def tiling_macros(asc_devkit: str, op_type: str, tiling_struct: str) -> str:
    """GET_TILING_DATA & co. for a registered C++ tiling struct, by the devkit's own generator.

    The generator's module imports the whole op compiler (native libraries), so
    only its module-level functions are taken from the source and run."""
    base = os.path.join(asc_devkit, "tools/build/asc_op_compile_base/asc_op_compiler")

    class _NoSettings:
        def get_variable(self, name: str) -> None:
            return None

    namespace = {"global_var_storage": _NoSettings(), "get_soc_spec": lambda key: ""}
    for name in ("generate_tiling_code.py", "get_op_tiling.py"):
        path = os.path.join(base, name)
        if not os.path.exists(path):
            raise CheckError(f"{path} is missing: ASC_DEVKIT must be an asc-devkit checkout")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        exec(compile(tree, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)
    if "gen_dynamic_shape_v2" not in namespace:
        raise CheckError(f"{base}/get_op_tiling.py has no gen_dynamic_shape_v2: unsupported asc-devkit version")
    text = namespace["gen_dynamic_shape_v2"](op_type, tiling_struct)
    # `[aicore]` is bisheng's attribute syntax; the stand-in defines __aicore__.
    return "\n".join(line for line in text.splitlines() if line.strip() != "#define __aicore__ [aicore]") + "\n"


def generate_kernel_tiling(asc_devkit: str, out_dir: str) -> None:
    script = os.path.join(asc_devkit, "impl/adv_api/cmake/scripts/gen_kernel_tiling_data_def.py")
    if not os.path.exists(script):
        raise CheckError(f"{script} is missing: ASC_DEVKIT must be an asc-devkit checkout")
    header = os.path.join(out_dir, "kernel_tiling", "kernel_tiling.h")
    os.makedirs(os.path.dirname(header), exist_ok=True)
    subprocess.run([sys.executable, script, os.path.join(asc_devkit, "include/adv_api"), header], check=True,
                   capture_output=True)
    if not os.path.exists(header):
        raise CheckError(f"{script} wrote no {header}")


def kernel_include_dirs(asc_devkit: str) -> list[str]:
    # CANN's asc_kernel_headers target, plus the devkit root (impl/... includes)
    # and include/utils; the simt/micro directories exist in some versions only.
    dirs = ["", "include", "include/basic_api", "include/simt_api", "include/micro_api", "include/utils", "impl",
            "impl/basic_api", "impl/simt_api", "impl/micro_api"]
    return [os.path.join(asc_devkit, d) for d in dirs if os.path.isdir(os.path.join(asc_devkit, d))]


def default_clang() -> str:
    """The project's pinned clang-19 (its Bazel wrapper, from runfiles), else clang++ on PATH."""
    roots = [os.environ.get("RUNFILES_DIR", ""), sys.argv[0] + ".runfiles", HERE]
    for root in roots:
        if root:
            for path in glob.glob(os.path.join(root, "*toolchain_root*", "bin", "clang")):
                return path
    for name in ("clang++-19", "clang++"):
        if shutil.which(name):
            return shutil.which(name)
    raise CheckError("no clang found: pass --clang")


def _clang(clang: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([clang, "-x", "c++", "-std=c++17", "-ferror-limit=0", *args], capture_output=True,
                          text=True)


def check_kernel(clang: str, asc_devkit: str, kernel_dir: str, work: str, dtypes: list[str]) -> list[Unit]:
    generate_kernel_tiling(asc_devkit, work)
    common = ["-D__NPU_ARCH__=2201", "-D__DAV_VEC__", "-D__DAV_C220_VEC__", "-include",
              os.path.join(HERE, "cann_standin.h")]
    includes = [f"-I{d}" for d in kernel_include_dirs(asc_devkit)] + [f"-I{work}", f"-I{kernel_dir}"]
    source = os.path.join(kernel_dir, KERNEL_SOURCE)
    pre = _clang(clang, ["-E", "-D__CHECK_FEATURE_AT_PRECOMPILE", *common, *includes, source])
    if pre.returncode != 0:
        return [Unit("kernel (precompile)", classify(parse_diagnostics(pre.stderr), [kernel_dir])[0] or
                     [Diagnostic(source, 0, "error", pre.stderr.strip()[-2000:])], [])]
    tiling_header = os.path.join(work, "rgdr_tiling_macros.h")
    with open(tiling_header, "w") as f:
        f.write(tiling_macros(asc_devkit, OP_TYPE, registered_tiling_struct(pre.stdout)))
    units = []
    for dtype in dtypes:
        result = _clang(clang, ["-fsyntax-only", *WARNINGS, f"-DDTYPE_QUERY={DTYPES[dtype]}", *common, "-include",
                                tiling_header, *includes, source])
        failures, filtered = classify(parse_diagnostics(result.stderr), [kernel_dir])
        if result.returncode != 0 and not failures and not filtered:
            failures = [Diagnostic(source, 0, "error", f"clang exited {result.returncode}: {result.stderr[-2000:]}")]
        units.append(Unit(f"kernel {dtype}", failures, filtered))
    return units


def check_op_host(clang: str, asc_devkit: str, metadef: str, op_host_dir: str) -> list[Unit]:
    includes = [os.path.join(HERE, "host_standin")] + [os.path.join(metadef, d) for d in
                ("inc/external", "inc/external/asc", "inc", "pkg_inc", "base")] + [
                os.path.join(asc_devkit, "include/utils"), os.path.join(asc_devkit, "include"), op_host_dir]
    has_op_def = any(os.path.exists(os.path.join(metadef, d, "register/op_def_registry.h"))
                     for d in ("inc/external", "inc/external/asc"))
    units = []
    for name, needs_op_def in OP_HOST_SOURCES.items():
        if needs_op_def and not has_op_def:
            units.append(Unit(f"op_host {name}", [], [], skipped="this metadef has no register/op_def_registry.h "
                              "(public from v9.1.0-beta.1)"))
            continue
        # NO_OPERATOR_IMPL: metadef's own switch for a ge::Operator forward
        # declaration instead of the graph engine's operator_reg.h.
        result = _clang(clang, ["-fsyntax-only", *WARNINGS, "-Wno-#pragma-messages", "-DNO_OPERATOR_IMPL",
                                *[f"-I{d}" for d in includes], os.path.join(op_host_dir, name)])
        failures, filtered = classify(parse_diagnostics(result.stderr), [op_host_dir])
        if result.returncode != 0 and not failures:
            failures = [Diagnostic(name, 0, "error", f"clang exited {result.returncode}: {result.stderr[-2000:]}")]
        units.append(Unit(f"op_host {name}", failures, filtered))
    return units


def run_check(asc_devkit: str, metadef: str, clang: Optional[str] = None, kernel_dir: str = KERNEL_DIR,
              op_host_dir: str = OP_HOST_DIR, dtypes: Optional[list[str]] = None) -> list[Unit]:
    for name, path in (("ASC_DEVKIT", asc_devkit), ("METADEF", metadef)):
        if not path or not os.path.isdir(path):
            raise CheckError(f"{name}={path!r} is not a directory")
    if not os.path.exists(os.path.join(asc_devkit, "include", "kernel_operator.h")):
        raise CheckError(f"{asc_devkit} has no include/kernel_operator.h: not an asc-devkit checkout")
    if not os.path.isdir(os.path.join(metadef, "inc", "external", "register")):
        raise CheckError(f"{metadef} has no inc/external/register: not a metadef checkout")
    clang = clang or default_clang()
    with tempfile.TemporaryDirectory(prefix="cann_header_check_") as work:
        return (check_kernel(clang, asc_devkit, kernel_dir, work, dtypes or list(DTYPES)) +
                check_op_host(clang, asc_devkit, metadef, op_host_dir))


def describe_checkout(path: str) -> str:
    """Its git commit and tag where it is a git checkout."""
    try:
        commit = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        tag = subprocess.run(["git", "-C", path, "describe", "--tags", "--always"], capture_output=True, text=True,
                             check=True).stdout.strip()
        return f"{path} ({tag}, {commit})"
    except (subprocess.CalledProcessError, FileNotFoundError):
        return f"{path} (not a git checkout)"


FLAGS = flags.FLAGS
flags.DEFINE_string("asc_devkit", os.environ.get("ASC_DEVKIT", ""), "asc-devkit checkout (default: $ASC_DEVKIT).")
flags.DEFINE_string("metadef", os.environ.get("METADEF", ""), "metadef checkout (default: $METADEF).")
flags.DEFINE_string("clang", None, "clang to parse with (default: the project's pinned clang-19).")
flags.DEFINE_list("dtypes", list(DTYPES), "Kernel instances to check.")


def main(argv: list[str]) -> int:
    del argv
    if not FLAGS.asc_devkit or not FLAGS.metadef:
        print("cann_header_check: skipped: set ASC_DEVKIT and METADEF to checkouts of asc-devkit and metadef "
              "(see ascend_kernels/recurrent_gated_delta_rule/README.md)")
        return 0
    logging.info("asc-devkit: %s", describe_checkout(FLAGS.asc_devkit))
    logging.info("metadef: %s", describe_checkout(FLAGS.metadef))
    units = run_check(FLAGS.asc_devkit, FLAGS.metadef, FLAGS.clang, dtypes=FLAGS.dtypes)
    for unit in units:
        status = f"skipped: {unit.skipped}" if unit.skipped else ("ok" if unit.ok else "FAILED")
        print(f"{unit.name:55s} {status} ({len(unit.filtered)} known stand-in artefacts filtered)")
        for d in unit.failures:
            print(f"    {d}")
    failed = [u for u in units if not u.ok]
    print(f"{len(units) - len(failed)} of {len(units)} units pass")
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main)

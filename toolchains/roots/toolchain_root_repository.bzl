"""Repository rule for the hermetic compiler root `./dev setup` unpacks from
toolchain_root.lock.json into `.deps/toolchain_root` (Debian 13 amd64:
clang-19, lld-19, llvm-19, GCC 14 for riscv64, the riscv64 cross libraries).

It generates one wrapper per tool under `bin/`: each runs the tool inside the
root with bubblewrap, binding Bazel's output base and the workspace at their
own paths, with SOURCE_DATE_EPOCH fixed and the execution root mapped to `.`
in debug info and macros, so objects do not depend on where or when they were
built. If the root is missing, every wrapper fails naming the set-up command;
no riscv64 target falls back to a host compiler.
"""

_TOOLS = {
    # wrapper name: (tool inside the root, is a compiler driver)
    "clang": ("/usr/bin/clang-19", True),
    "clang-cpp": ("/usr/bin/clang-cpp-19", True),
    "ld.lld": ("/usr/bin/ld.lld-19", False),
    "llvm-ar": ("/usr/bin/llvm-ar-19", False),
    "llvm-nm": ("/usr/bin/llvm-nm-19", False),
    "llvm-objcopy": ("/usr/bin/llvm-objcopy-19", False),
    "llvm-objdump": ("/usr/bin/llvm-objdump-19", False),
    "llvm-strip": ("/usr/bin/llvm-strip-19", False),
    "gcc": ("/usr/bin/riscv64-linux-gnu-gcc-14", True),
    "cpp": ("/usr/bin/riscv64-linux-gnu-cpp-14", True),
    "ld": ("/usr/bin/riscv64-linux-gnu-ld", False),
    "ar": ("/usr/bin/riscv64-linux-gnu-ar", False),
    "nm": ("/usr/bin/riscv64-linux-gnu-nm", False),
    "objcopy": ("/usr/bin/riscv64-linux-gnu-objcopy", False),
    "objdump": ("/usr/bin/riscv64-linux-gnu-objdump", False),
    "strip": ("/usr/bin/riscv64-linux-gnu-strip", False),
}

_WRAPPER = """#!/bin/bash
ROOT="{root}"
WORKSPACE="{workspace}"
if [[ ! -f "$ROOT/INSTALLED" ]]; then
  echo "the riscv64 toolchain root is missing at $ROOT: run ./dev setup" >&2
  exit 1
fi
# Bazel sets PWD=/proc/self/cwd for C++ actions: use the physical directory.
HERE="$(pwd -P)"
case "$HERE" in
  */sandbox/*) BASE="${{HERE%%/sandbox/*}}" ;;
  */execroot/*) BASE="${{HERE%%/execroot/*}}" ;;
  *) BASE="$HERE" ;;
esac
EXTRA=()
if [[ "{driver}" == "1" ]]; then
  EXTRA=(-ffile-prefix-map="$HERE"=. -fdebug-prefix-map="$HERE"=.)
fi
# A tmpfs root holding the toolchain root's /usr and /etc: bwrap can then
# create the bind mount points even where the root itself is read-only (in
# Bazel's sandbox).
exec bwrap --tmpfs / --ro-bind "$ROOT/usr" /usr --ro-bind "$ROOT/etc" /etc \\
  --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --symlink usr/sbin /sbin \\
  --bind "$BASE" "$BASE" --ro-bind "$WORKSPACE" "$WORKSPACE" \\
  --bind /tmp /tmp --proc /proc --dev /dev --chdir "$HERE" \\
  --setenv SOURCE_DATE_EPOCH 0 --setenv PATH /usr/bin:/bin --unsetenv LD_LIBRARY_PATH \\
  "{tool}" "${{EXTRA[@]}}" "$@"
"""

def _toolchain_root_impl(ctx):
    workspace = str(ctx.path(Label("@//:WORKSPACE")).dirname)
    ctx.read(Label("@//toolchains/roots:toolchain_root.lock.json"))  # re-run when the lock changes
    root = workspace + "/.deps/toolchain_root"
    for name, (tool, driver) in _TOOLS.items():
        ctx.file("bin/" + name, _WRAPPER.format(root = root, workspace = workspace, tool = tool,
                                                driver = "1" if driver else "0"), executable = True)
    ctx.file("defs.bzl", 'TOOL_DIR = "%s"\nROOT = "%s"\n' % (ctx.path("bin"), root))
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

filegroup(
    name = "wrappers",
    srcs = glob(["bin/*"]),
)
""")

toolchain_root_repository = repository_rule(
    implementation = _toolchain_root_impl,
    local = True,
)

"""The RVV kernel library rebuilt from clean in two different Bazel output bases,
with each compiler (clang-19 and GCC 14 from the pinned root), is byte-for-byte
identical: objects depend neither on where nor on when they were built. So is
the riscv64 wheel a board installs.

Each output base builds the wheel (its extension compiles the kernels with
clang) and then the kernel library for the GCC platform, with one Bazel server
and one fetch of the toolchains."""

from __future__ import annotations

import filecmp
import glob
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
GCC_PLATFORM = "//toolchains/platforms:linux_riscv64_gcc"
BUILDS = (["//python:wheel_riscv64"], [f"--platforms={GCC_PLATFORM}", "//rvv_kernels/linear:bf16_packed_linear"])


def build(output_base: str) -> tuple[dict[str, str], bytes]:
    """Builds from clean; returns ({relative path: absolute path} of the kernels' objects and
    archives, the wheel's bytes)."""
    try:
        for targets in BUILDS:
            cmd = ["bazel", f"--output_base={output_base}", "build", "--symlink_prefix=/"] + targets
            result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
            if result.returncode != 0:
                raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    finally:
        subprocess.run(["bazel", f"--output_base={output_base}", "shutdown"], cwd=ROOT, capture_output=True)
    out = os.path.join(output_base, "execroot", "rvascend", "bazel-out")
    files = {}
    for path in glob.glob(os.path.join(out, "*", "bin", "rvv_kernels", "**", "*"), recursive=True):
        if path.endswith((".o", ".a", ".lo")):
            files[os.path.relpath(path, out)] = path
    (wheel,) = glob.glob(os.path.join(out, "*", "bin", "python", "rvascend-*-cp313-cp313-linux_riscv64.whl"))
    with open(wheel, "rb") as f:
        return files, f.read()


class RebuildTest(unittest.TestCase):
    def test_two_clean_builds_are_identical(self):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            first, first_wheel = build(os.path.join(tmp, "a"))
            second, second_wheel = build(os.path.join(tmp, "second-output-base"))
            self.assertEqual(sorted(first), sorted(second))
            # Both compilers' kernels are among them: one configuration per platform.
            configs = {rel.split(os.sep)[0] for rel in first if "bf16_gemv_packed_1x128_rvv" in rel}
            self.assertGreaterEqual(len(configs), 2, sorted(first))
            differing = [rel for rel in first if not filecmp.cmp(first[rel], second[rel], shallow=False)]
            self.assertEqual(differing, [], "objects differ between output bases")
            print(f"{len(first)} objects and archives identical ({', '.join(sorted(configs))})")
            self.assertEqual(first_wheel, second_wheel, "the riscv64 wheel differs between clean builds")
            print(f"wheel: {len(first_wheel)} bytes, identical in two clean builds")


if __name__ == "__main__":
    sys.exit(unittest.main())

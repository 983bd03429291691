"""The RVV kernel library rebuilt from clean in two different Bazel output bases,
with each compiler (clang-19 and GCC 14 from the pinned root), is byte-for-byte
identical: objects depend neither on where nor on when they were built. So is
the riscv64 wheel a board installs."""

from __future__ import annotations

import filecmp
import glob
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
TARGET = "//rvv_kernels/linear:bf16_packed_linear"
PLATFORMS = {"llvm": "//toolchains/platforms:linux_riscv64", "gcc": "//toolchains/platforms:linux_riscv64_gcc"}


def build(output_base: str, platform: str) -> dict[str, str]:
    """Builds TARGET from clean; returns {relative path: absolute path} of its objects and archives."""
    cmd = ["bazel", f"--output_base={output_base}", "build", f"--platforms={platform}", "--symlink_prefix=/",
           TARGET]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    subprocess.run(["bazel", f"--output_base={output_base}", "shutdown"], cwd=ROOT, capture_output=True)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    bin_dirs = glob.glob(os.path.join(output_base, "execroot", "rvascend", "bazel-out", "*", "bin", "rvv_kernels"))
    files = {}
    for bin_dir in bin_dirs:
        for path in glob.glob(os.path.join(bin_dir, "**", "*"), recursive=True):
            if path.endswith((".o", ".a", ".lo")):
                files[os.path.relpath(path, os.path.dirname(os.path.dirname(bin_dir)))] = path
    return files


class RebuildTest(unittest.TestCase):
    def check(self, compiler: str) -> None:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            first = build(os.path.join(tmp, "a"), PLATFORMS[compiler])
            second = build(os.path.join(tmp, "second-output-base"), PLATFORMS[compiler])
            self.assertTrue(any("bf16_gemv_packed_1x128_rvv" in p for p in first), sorted(first))
            self.assertEqual(sorted(first), sorted(second))
            differing = [rel for rel in first if not filecmp.cmp(first[rel], second[rel], shallow=False)]
            self.assertEqual(differing, [], f"{compiler}: objects differ between output bases")
            print(f"{compiler}: {len(first)} objects and archives identical")

    def test_wheel(self):
        wheels = []
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            for base in ("a", "second-output-base"):
                output_base = os.path.join(tmp, base)
                cmd = ["bazel", f"--output_base={output_base}", "build", "--symlink_prefix=/", "//python:wheel_riscv64"]
                result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
                subprocess.run(["bazel", f"--output_base={output_base}", "shutdown"], cwd=ROOT, capture_output=True)
                self.assertEqual(result.returncode, 0, result.stderr[-3000:])
                (path,) = glob.glob(os.path.join(output_base, "execroot", "rvascend", "bazel-out", "*", "bin", "python",
                                                 "rvascend-*-cp313-cp313-linux_riscv64.whl"))
                with open(path, "rb") as f:
                    wheels.append(f.read())
        self.assertEqual(wheels[0], wheels[1], "the riscv64 wheel differs between clean builds")
        print(f"wheel: {len(wheels[0])} bytes, identical in two clean builds")

    def test_llvm(self):
        self.check("llvm")

    def test_gcc(self):
        self.check("gcc")


if __name__ == "__main__":
    sys.exit(unittest.main())

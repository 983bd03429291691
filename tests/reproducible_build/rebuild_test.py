"""Builds depend neither on where nor on when they ran: the riscv64 wheel a board
installs, built from clean in a fresh Bazel output base, is byte for byte the wheel the
suite's own output base built (a data dependency of this test); the RVV kernel library
built with GCC 14 in two fresh output bases gives identical objects and archives. The
suite's build serves as the wheel's second build (its clang objects are inside it):
compiling the extension against torch's headers is most of a clean build's time."""

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
GCC_LIBRARY = [f"--platforms={GCC_PLATFORM}", "//rvv_kernels/linear:bf16_packed_linear"]
WHEEL = ["//python:wheel_riscv64"]
WHEEL_FILE = "rvascend-*-cp313-cp313-linux_riscv64.whl"


def build(output_base: str, *target_lists: list[str]) -> str:
    """Builds each list of targets from clean in `output_base`; returns its bazel-out."""
    try:
        for targets in target_lists:
            cmd = ["bazel", f"--output_base={output_base}", "build", "--symlink_prefix=/"] + targets
            result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
            if result.returncode != 0:
                raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    finally:
        subprocess.run(["bazel", f"--output_base={output_base}", "shutdown"], cwd=ROOT, capture_output=True)
    return os.path.join(output_base, "execroot", "rvascend", "bazel-out")


def objects(out: str) -> dict[str, str]:
    """{path relative to bazel-out: absolute path} of the kernels' objects and archives."""
    return {os.path.relpath(path, out): path
            for path in glob.glob(os.path.join(out, "*", "bin", "rvv_kernels", "**", "*"), recursive=True)
            if path.endswith((".o", ".a", ".lo"))}


def suite_wheel() -> str:
    """The wheel this test depends on, as the suite's output base built it."""
    runfiles = os.environ.get("RUNFILES_DIR") or os.environ.get("TEST_SRCDIR") or ROOT
    found = glob.glob(os.path.join(runfiles, "**", WHEEL_FILE), recursive=True)
    if not found:
        raise AssertionError(f"the suite's riscv64 wheel is not among the runfiles under {runfiles}")
    return found[0]


class RebuildTest(unittest.TestCase):
    def test_clean_builds_are_identical(self):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            first = build(os.path.join(tmp, "a"), WHEEL, GCC_LIBRARY)
            second = build(os.path.join(tmp, "second-output-base"), GCC_LIBRARY)
            (wheel,) = glob.glob(os.path.join(first, "*", "bin", "python", WHEEL_FILE))
            self.assertTrue(filecmp.cmp(wheel, suite_wheel(), shallow=False),
                            "the riscv64 wheel differs between the suite's build and a clean one")
            print(f"wheel: {os.path.getsize(wheel)} bytes, identical to the suite's")
            first_objects, second_objects = objects(first), objects(second)
            gcc = {rel for rel in second_objects if "bf16_gemv_packed_1x128_rvv" in rel}
            self.assertTrue(gcc, sorted(second_objects))
            # Both compilers' kernels were built in the first base: one configuration per platform.
            configs = {rel.split(os.sep)[0] for rel in first_objects if "bf16_gemv_packed_1x128_rvv" in rel}
            self.assertGreaterEqual(len(configs), 2, sorted(first_objects))
            self.assertLessEqual(set(second_objects), set(first_objects))
            differing = [rel for rel in second_objects
                         if not filecmp.cmp(first_objects[rel], second_objects[rel], shallow=False)]
            self.assertEqual(differing, [], "GCC objects differ between output bases")
            print(f"{len(second_objects)} GCC objects and archives identical; "
                  f"configurations built: {', '.join(sorted(configs))}")


if __name__ == "__main__":
    sys.exit(unittest.main())

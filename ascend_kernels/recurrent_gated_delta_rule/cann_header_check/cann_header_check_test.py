"""The CANN header check: its diagnostics policy always; with checkouts of asc-devkit
and metadef (ASC_DEVKIT, METADEF), that the sources pass and that deliberate API
mistakes in copies of them fail."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cann_header_check as check  # noqa: E402

ASC_DEVKIT = os.environ.get("ASC_DEVKIT", "")
METADEF = os.environ.get("METADEF", "")
NO_CHECKOUTS = "ASC_DEVKIT and METADEF are not set: the check against CANN's headers was not run"

DEVKIT_HEADER = "/devkit/impl/utils/debug/asc_aicore_dump_impl.h"


class PolicyTest(unittest.TestCase):
    def test_the_known_artefact_is_filtered_by_exact_message_only(self):
        own = "/project/op_kernel"
        stderr = "\n".join([
            f"{DEVKIT_HEADER}:225:50: error: redefinition of 'asc_dump'",
            f"{DEVKIT_HEADER}:230:1: error: redefinition of 'asc_dump2'",
            "/devkit/impl/other.h:9:1: error: redefinition of 'asc_dump'",
            "/devkit/impl/other.h:10:1: warning: unused variable 'x' [-Wunused-variable]",
            f"{own}/kernel.h:161:79: warning: unused parameter 'align' [-Wunused-parameter]",
            f"{own}/kernel.h:170:3: note: to match this '('",
        ])
        failures, filtered = check.classify(check.parse_diagnostics(stderr), [own])
        self.assertEqual([(d.line, d.message) for d in filtered], [(225, "redefinition of 'asc_dump'")])
        self.assertEqual([(os.path.basename(d.file), d.line) for d in failures],
                         [("asc_aicore_dump_impl.h", 230), ("other.h", 9), ("kernel.h", 161)])

    def test_the_registered_tiling_struct_is_read_from_the_precompile_expansion(self):
        text = "x;\n  auto __enable_custom_tiling rgdr::RecurrentGatedDeltaRuleTilingData = default;\n"
        self.assertEqual(check.registered_tiling_struct(text), "rgdr::RecurrentGatedDeltaRuleTilingData")
        with self.assertRaisesRegex(check.CheckError, "found none"):
            check.registered_tiling_struct("int x;")
        with self.assertRaisesRegex(check.CheckError, "expected one"):
            check.registered_tiling_struct(text + "auto __enable_custom_tiling B = default;")

    def test_without_checkouts_the_command_says_it_skipped(self):
        check.FLAGS(["cann_header_check", "--asc_devkit=", "--metadef="])
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(check.main([]), 0)
        self.assertIn("skipped: set ASC_DEVKIT and METADEF", out.getvalue())

    def test_a_directory_that_is_not_a_checkout_is_refused(self):
        with tempfile.TemporaryDirectory() as empty:
            with self.assertRaisesRegex(check.CheckError, "not an asc-devkit checkout"):
                check.run_check(empty, empty, clang="clang")


@unittest.skipUnless(ASC_DEVKIT and METADEF, NO_CHECKOUTS)
class AgainstCannHeadersTest(unittest.TestCase):
    """Each mutation is a mistake the twin would not see: the twin is ours, these headers are CANN's."""

    @classmethod
    def setUpClass(cls):
        cls.clang = check.default_clang()

    def test_the_kernel_and_op_host_pass(self):
        units = check.run_check(ASC_DEVKIT, METADEF, self.clang)
        for unit in units:
            self.assertTrue(unit.ok, f"{unit.name}: " + "\n".join(map(str, unit.failures)))
        self.assertEqual([u.name for u in units if u.name.startswith("kernel")], ["kernel bf16", "kernel fp16"])
        self.assertGreaterEqual(sum(1 for u in units if u.name.startswith("op_host") and not u.skipped), 3)

    def _mutated(self, directory: str, file: str, old: str, new: str) -> str:
        # Both source trees, side by side as in the repository (op_host includes ../op_kernel).
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        for tree in (check.KERNEL_DIR, check.OP_HOST_DIR):
            shutil.copytree(tree, os.path.join(root, os.path.basename(tree)))
        copy = os.path.join(root, os.path.basename(directory))
        path = os.path.join(copy, file)
        with open(path) as f:
            text = f.read()
        self.assertEqual(text.count(old), 1, f"{old!r} must occur once in {file}")
        with open(path, "w") as f:
            f.write(text.replace(old, new))
        return copy

    def _kernel_fails(self, old: str, new: str, expect: str) -> None:
        kernel = self._mutated(check.KERNEL_DIR, "recurrent_gated_delta_rule.h", old, new)
        with tempfile.TemporaryDirectory() as work:
            (unit,) = check.check_kernel(self.clang, ASC_DEVKIT, kernel, work, ["bf16"])
        self.assertFalse(unit.ok, f"the check passed a kernel with {new!r}")
        ours = [d for d in unit.failures if os.path.abspath(d.file).startswith(os.path.abspath(kernel) + os.sep)]
        self.assertTrue(any(expect in d.message for d in ours), "\n".join(map(str, unit.failures)))

    def test_a_wrong_argument_count_fails(self):
        self._kernel_fails("pipe_->InitBuffer(tmpBuf_, t_.ubRestBytes);",
                           "pipe_->InitBuffer(tmpBuf_, t_.ubRestBytes, 2, 4);", "no matching member function")
        self._kernel_fails("AscendC::WholeReduceSum(out[r0], dotTmp_, width, static_cast<int32_t>(n), 1, 1, 8);",
                           "AscendC::WholeReduceSum(out[r0], dotTmp_, width, static_cast<int32_t>(n), 1, 1);",
                           "no matching function")

    def test_a_wrong_parameter_type_fails(self):
        self._kernel_fails("AscendC::DataCopyPad(local, src, params, pad);",
                           "AscendC::DataCopyPad(local, src, params, params);", "no matching function")
        self._kernel_fails("AscendC::BrcbRepeatParams(1, 8)", "AscendC::BinaryRepeatParams()",
                           "no matching function")

    def test_an_api_name_that_does_not_exist_fails(self):
        self._kernel_fails("AscendC::GetBlockIdx()", "AscendC::GetBlockIdxx()", "GetBlockIdxx")

    def test_a_narrowing_or_an_unused_parameter_in_the_kernel_fails(self):
        self._kernel_fails("static_cast<uint8_t>(t_.stateOutBufferNum)", "t_.stateOutBufferNum",
                           "implicit conversion loses integer precision")

    def test_an_op_host_mistake_fails(self):
        host = self._mutated(check.OP_HOST_DIR, "recurrent_gated_delta_rule_tiling_register.cpp",
                             "context->SetBlockDim(r.data.blockDim);", "context->SetBlockDim(r.data.blockDim, 1);")
        units = check.check_op_host(self.clang, ASC_DEVKIT, METADEF, host)
        failed = [u for u in units if not u.ok]
        self.assertEqual([u.name for u in failed], ["op_host recurrent_gated_delta_rule_tiling_register.cpp"])


if __name__ == "__main__":
    unittest.main()

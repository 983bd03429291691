"""Bazel's Python toolchain is the project venv: torch 2.13 (CPU) imports and computes."""

import sys
import unittest

import torch


class VenvTorchTest(unittest.TestCase):
    def test_interpreter_is_the_project_venv(self):
        self.assertIn("/.venv/", sys.executable + "/")

    def test_torch_is_the_pinned_cpu_build(self):
        self.assertTrue(torch.__version__.startswith("2.13.0"), torch.__version__)
        x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
        w = torch.ones(4, 3, dtype=torch.bfloat16)
        self.assertEqual(torch.nn.functional.linear(x, w).float().sum().item(), 60.0)


if __name__ == "__main__":
    unittest.main()

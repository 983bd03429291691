"""The main of every rvascend_py_test: runs the pytest file named by the first argument.

A test file's own `__main__` block is not needed (and not trusted): a file without
one used to run nothing under `bazel test` and pass. pytest exits non-zero when a
file collects no test, so an empty or mistyped file fails here too.
"""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main([sys.argv[1], "-q", *sys.argv[2:]]))

"""The bench programs' flags: defined only by the program that runs, so any set of
bench modules imports into one process (pytest over the package), and each
program still parses its own command line."""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import pkgutil
import subprocess
import sys

import pytest
from absl import app, flags, logging  # noqa: F401 - their own flags are defined before the count

import rvascend.bench

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules() -> list[str]:
    """The bench modules this interpreter runs (a *_guest module runs in another: llama.cpp's
    venv, the riscv64 image)."""
    return sorted(m.name for m in pkgutil.iter_modules(rvascend.bench.__path__)
                  if not m.ispkg and not m.name.endswith(("_test", "_guest")) and not m.name.startswith("_"))


def _programs() -> list[str]:
    """The bench modules that are command lines (absl's app.run under __main__)."""
    here = os.path.dirname(os.path.abspath(rvascend.bench.__file__))
    return [m for m in _modules() if "app.run(main)" in open(os.path.join(here, m + ".py")).read()]


def test_every_bench_module_imports_beside_the_others():
    defined = set(flags.FLAGS)
    for name in _modules():
        importlib.import_module(f"rvascend.bench.{name}")
    # Importing defines no flag: two programs' --output would collide.
    assert set(flags.FLAGS) == defined


def test_each_program_defines_its_flags_when_run():
    programs = _programs()
    assert "llama_cpp_peer" in programs and "riscv64_step" in programs and len(programs) >= 14

    def helpshort(name: str) -> str:
        run = subprocess.run([sys.executable, "-m", f"rvascend.bench.{name}", "--helpshort"], cwd=_PACKAGE,
                             capture_output=True, text=True, timeout=120)
        return run.stdout + run.stderr

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        helps = dict(zip(programs, pool.map(helpshort, programs)))
    for name, text in helps.items():
        assert "--output" in text, (name, text[-2000:])
        assert "Traceback" not in text, (name, text[-2000:])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Set-up's steps: the image's tree hash covers sources, not the bytecode compiled
from them; the bytecode step runs once per import list; a failed build command is
a SetupError showing its output."""

from __future__ import annotations

import os

import pytest

from rvascend.setup import steps


def _tree(root: str) -> None:
    os.makedirs(os.path.join(root, "usr", "lib", "python3", "dist-packages", "pkg"))
    with open(os.path.join(root, "usr", "lib", "python3", "dist-packages", "pkg", "__init__.py"), "w") as f:
        f.write("x = 1\n")


def test_tree_hash_ignores_bytecode_and_stamps(tmp_path):
    root = str(tmp_path)
    _tree(root)
    before = steps.fix_up_image(root)
    cache = os.path.join(root, "usr", "lib", "python3", "dist-packages", "pkg", "__pycache__")
    os.makedirs(cache)
    with open(os.path.join(cache, "__init__.cpython-313.pyc"), "wb") as f:
        f.write(b"\0" * 16)
    with open(os.path.join(root, steps.BYTECODE_STAMP), "w") as f:
        f.write("torch\n")
    assert steps.fix_up_image(root) == before
    with open(os.path.join(root, "usr", "lib", "python3", "dist-packages", "pkg", "extra.py"), "w") as f:
        f.write("y = 2\n")
    assert steps.fix_up_image(root) != before


def test_bytecode_step_runs_once_per_import_list(tmp_path, monkeypatch):
    root = str(tmp_path)
    calls = []
    monkeypatch.setattr(steps, "_run", lambda cmd, dry_run, **kw: calls.append(cmd) or 0)
    steps.ensure_image_bytecode(root, dry_run=False)
    assert len(calls) == 1 and calls[0][-1] == "import " + ", ".join(steps.IMAGE_IMPORTS)
    assert "-B" not in calls[0]  # the point is to write the bytecode
    steps.ensure_image_bytecode(root, dry_run=False)
    assert len(calls) == 1
    monkeypatch.setattr(steps, "IMAGE_IMPORTS", steps.IMAGE_IMPORTS + ("email",))
    steps.ensure_image_bytecode(root, dry_run=False)
    assert len(calls) == 2


def test_bytecode_step_failure_is_a_setup_error(tmp_path, monkeypatch):
    monkeypatch.setattr(steps, "_run", lambda cmd, dry_run, **kw: 1)
    with pytest.raises(steps.SetupError, match="could not import its packages"):
        steps.ensure_image_bytecode(str(tmp_path), dry_run=False)
    assert not os.path.exists(os.path.join(str(tmp_path), steps.BYTECODE_STAMP))


def test_a_failed_build_command_is_a_setup_error_with_its_output(tmp_path):
    from rvascend.setup import debian

    debian.run_step(["true"], cwd=str(tmp_path))
    with pytest.raises(debian.SetupError, match=r"(?s)sh -c .* failed \(3\):\n.*out-line.*err-line"):
        debian.run_step(["sh", "-c", "echo out-line; echo err-line >&2; exit 3"], cwd=str(tmp_path))

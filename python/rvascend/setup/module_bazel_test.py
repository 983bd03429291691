"""MODULE.bazel (Bazel >= 7) and WORKSPACE (the offline Bazel 4 path) declare the same
repositories and register the same toolchains, so neither can drift from the other."""

from __future__ import annotations

import os
import re

from rvascend import checkout

# WORKSPACE-only: Bazel 4 asks for these at every test and they cannot be downloaded
# here, so the project carries stand-ins; a bzlmod Bazel brings its own.
BAZEL4_STAND_INS = {"rules_java", "remote_coverage_tools"}
# MODULE-only: Bazel 4 bundles it.
BUNDLED_IN_BAZEL4 = {"platforms"}


def _read(name: str) -> str:
    with open(os.path.join(checkout.root(), name), encoding="utf-8") as f:
        return f.read()


def _repositories(text: str) -> set[str]:
    """Names of the repositories a file declares: every rule call's `name = "..."` but the
    workspace's and the module's own."""
    return set(re.findall(r'^\s*(?:\w+\()?\s*name = "([^"]+)"', text, re.M)) - {"rvascend"}


def _toolchains(text: str) -> list[str]:
    block = re.search(r"register_toolchains\((.*?)\)", text, re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def test_module_and_workspace_declare_the_same_repositories():
    workspace, module = _read("WORKSPACE"), _read("MODULE.bazel")
    assert _repositories(workspace) - BAZEL4_STAND_INS == _repositories(module) - BUNDLED_IN_BAZEL4
    assert _toolchains(workspace) == _toolchains(module)


def test_the_comparison_sees_a_missing_repository():
    module = _read("MODULE.bazel")
    cut = re.sub(r'pinned_file_repository\(\s*name = "llama_cpp".*?\n\)\n', "", module, flags=re.S)
    assert cut != module and "llama_cpp" not in _repositories(cut)

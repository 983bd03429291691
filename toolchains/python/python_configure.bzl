"""Repository rule exposing the project venv (`.venv/`) to Bazel.

It asks the venv's interpreter for its include directories (as JAX's and
TensorFlow's `python_configure` do) and publishes:
  :py_toolchain     the venv interpreter as Bazel's Python 3 toolchain
  :python_headers   Python.h and friends
  :pybind11         pybind11's headers, from the installed pip package
The interpreter path is the venv's own `bin/python3`, never its realpath:
resolving the symlink would escape the venv and lose its site-packages.
"""

load("//toolchains/python:python_headers.bzl", "PYTHON_HEADERS_BUILD")

_QUERY = """
import sys, sysconfig
import pybind11
print(sysconfig.get_paths()["include"])
print(pybind11.get_include())
print(sysconfig.get_config_var("EXT_SUFFIX"))
print("%d.%d" % sys.version_info[:2])
"""

def _workspace_root(ctx):
    return ctx.path(Label("@//:WORKSPACE")).dirname

def _python_configure_impl(ctx):
    # Re-run when the pinned requirements change (the venv changes with them).
    ctx.read(Label("@//:requirements.txt"))
    venv = ctx.os.environ.get("RVASCEND_VENV") or "%s/.venv" % _workspace_root(ctx)
    python = ctx.path("%s/bin/python3" % venv)
    if not python.exists:
        fail("No project venv at %s: run `./dev setup` first (it creates the venv and installs the pinned requirements)." % venv)
    result = ctx.execute([str(python), "-c", _QUERY])
    if result.return_code != 0:
        fail("The venv interpreter %s could not report its headers (is pybind11 installed? run `./dev setup`):\n%s" % (python, result.stderr))
    python_include, pybind11_include, ext_suffix, version = result.stdout.strip().split("\n")
    ctx.symlink(python_include, "python_include")
    ctx.symlink(pybind11_include, "pybind11_include")
    ctx.file("BUILD.bazel", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(python = python) + PYTHON_HEADERS_BUILD)
    ctx.file("defs.bzl", 'PYTHON_EXT_SUFFIX = "{}"\nPYTHON_VERSION = "{}"\n'.format(ext_suffix, version))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = ["RVASCEND_VENV"],
    local = True,
)

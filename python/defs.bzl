"""Thin wrappers that keep python/BUILD.bazel uniform (JAX-style repo-local macros)."""

load("@rules_python//python:defs.bzl", "py_binary", "py_library", "py_test")

def rvascend_subpackage(name, deps = [], data = []):
    """One subpackage of rvascend (python/rvascend/NAME) as its own py_library,
    :rvascend_NAME; `deps` are the subpackages below it (rvascend/layering_test.py
    holds the order)."""
    py_library(
        name = "rvascend_" + name,
        srcs = native.glob(["rvascend/%s/**/*.py" % name], exclude = ["rvascend/**/*_test.py"]),
        data = data,
        imports = ["."],
        deps = [":rvascend_root"] + [":rvascend_" + d for d in deps],
    )

def rvascend_py_test(src, size = "medium", data = [], args = [], **kwargs):
    """A pytest file of the rvascend package as a Bazel test named after the file,
    run by pytest_runner.py (so every test in it runs, whatever the file's own main)."""
    py_test(
        name = src.rsplit("/", 1)[-1][:-len(".py")],
        size = size,
        srcs = [src, "pytest_runner.py"],
        main = "pytest_runner.py",
        args = ["$(rootpath %s)" % src] + args,
        data = data,
        deps = [":rvascend"],
        **kwargs
    )

def rvascend_py_binary(name, src, **kwargs):
    """A module of the rvascend package run as a program (`bazel run //python:NAME`)."""
    py_binary(
        name = name,
        srcs = [src],
        main = src,
        deps = [":rvascend"],
        **kwargs
    )

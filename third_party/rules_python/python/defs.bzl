"""Forwards rules_python's public rules to Bazel's native Python rules.

BUILD files load `@rules_python//python:defs.bzl` exactly as a bzlmod build
does; offline on Bazel 4 this stand-in resolves the same names natively.
"""

load("@bazel_tools//tools/python:toolchain.bzl", _py_runtime_pair = "py_runtime_pair")

py_runtime_pair = _py_runtime_pair

def py_library(**attrs):
    native.py_library(**attrs)

def py_binary(**attrs):
    native.py_binary(**attrs)

def py_test(**attrs):
    native.py_test(**attrs)

def py_runtime(**attrs):
    native.py_runtime(**attrs)

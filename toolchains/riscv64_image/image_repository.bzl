"""Repository rule exposing the riscv64 image that `./dev setup` builds from
image.lock.json into `.deps/riscv64_image` (sysroot, Python 3.13 headers,
pybind11 headers, the image's own python3 and torch 2.6).

If the image is missing, `:image_ready` fails the build with the set-up
command to run (image targets never fall back to anything else).
"""

load("//toolchains/python:python_headers.bzl", "PYTHON_HEADERS_BUILD")

def _image_repository_impl(ctx):
    root = "%s/.deps/riscv64_image" % ctx.path(Label("@//:WORKSPACE")).dirname
    ctx.read(Label("@//toolchains/riscv64_image:image.lock.json"))  # re-run when the lock changes
    stamp = ctx.path(root + "/IMAGE_SHA256")
    ready = stamp.exists
    if ready:
        ctx.symlink(root + "/usr/include/python3.13", "python_include")
        ctx.symlink(root + "/usr/include/pybind11", "pybind11_include/pybind11")
        ready_cmd = "cat '%s' > $@" % stamp
    else:
        ctx.file("python_include/Python.h", "#error riscv64 image missing: run ./dev setup\n")
        ctx.file("pybind11_include/pybind11/pybind11.h", "#error riscv64 image missing: run ./dev setup\n")
        ready_cmd = "echo 'the riscv64 image is not set up: run ./dev setup' >&2; exit 1"
    ctx.file("defs.bzl", 'IMAGE_ROOT = "%s"\n' % root)
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

genrule(
    name = "image_ready",
    outs = ["image_sha256.txt"],
    cmd = "{ready_cmd}",
    local = True,
)
""".format(ready_cmd = ready_cmd) + PYTHON_HEADERS_BUILD)

image_repository = repository_rule(
    implementation = _image_repository_impl,
    local = True,
)

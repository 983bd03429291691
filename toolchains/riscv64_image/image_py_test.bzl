"""`image_py_test`: a Python program or pytest file of the rvascend package run
by the riscv64 image's python3.13 (torch 2.6) under qemu-riscv64, with the
kernels' extension cross-compiled for that image."""

load("@riscv64_image//:defs.bzl", "IMAGE_ROOT")
load("//toolchains/qemu:rvv_test.bzl", "env_exports")

def _image_py_test_impl(ctx):
    runner = ctx.actions.declare_file(ctx.label.name + "_runner.sh")
    extension = ctx.files.extension[0]
    ctx.actions.expand_template(
        template = ctx.file._template,
        output = runner,
        substitutions = {
            "%QEMU%": ctx.file._qemu.short_path,
            "%IMAGE%": IMAGE_ROOT,
            "%IMAGE_READY%": ctx.file._image_ready.short_path,
            "%EXTENSION%": extension.short_path,
            "%EXTRA_EXTENSIONS%": " ".join([f.short_path for f in ctx.files.extra_extensions]),
            "%MAIN%": ctx.file.main.short_path,
            "%PYTEST%": "1" if ctx.attr.pytest else "0",
            "%VLENS%": " ".join([str(v) for v in ctx.attr.vlens]),
            "%ENV%": env_exports(ctx.attr.env),
        },
        is_executable = True,
    )
    files = [ctx.file._qemu, ctx.file._image_ready, extension, ctx.file.main] + ctx.files.extra_extensions
    runfiles = ctx.runfiles(files = files).merge(ctx.attr.package[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = runner, runfiles = runfiles)]

image_py_test = rule(
    implementation = _image_py_test_impl,
    test = True,
    attrs = {
        "main": attr.label(mandatory = True, allow_single_file = [".py"]),
        "pytest": attr.bool(default = False),
        "vlens": attr.int_list(default = [256, 128]),
        "env": attr.string_dict(),
        "extension": attr.label(default = "//python:rvv_kernels_extension_riscv64_image"),
        # More of the package's extensions built for the image (the gated-delta-rule op's
        # _recurrent_gated_delta_rule.so, for hybrid models), staged into rvascend/ops/ under their own names.
        "extra_extensions": attr.label_list(),
        "package": attr.label(default = "//python:rvascend"),
        "_template": attr.label(
            default = "//toolchains/riscv64_image:image_py_test_runner.sh.tpl",
            allow_single_file = True,
        ),
        "_qemu": attr.label(default = "@qemu//:qemu-riscv64", allow_single_file = True),
        "_image_ready": attr.label(default = "@riscv64_image//:image_ready", allow_single_file = True),
    },
)

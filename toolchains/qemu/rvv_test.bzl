"""`rvv_cc_test`: build a cc binary for riscv64 and run it under QEMU at several VLENs.

The test itself lives in the host configuration (so plain `bazel test //...`
runs it); its `binary` attribute goes through a transition to a riscv64
platform, and the generated runner executes that binary under the pinned
`qemu-riscv64` once per VLEN with tail/mask-agnostic elements set to all ones,
which exposes kernels that read tail lanes they did not write.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary")

def _riscv64_transition_impl(settings, attr):
    return {"//command_line_option:platforms": str(attr.platform)}

_riscv64_transition = transition(
    implementation = _riscv64_transition_impl,
    inputs = [],
    outputs = ["//command_line_option:platforms"],
)

def shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"

def env_exports(env):
    """`export K='V'` lines for a test runner script."""
    return "\n".join(["export %s=%s" % (k, shell_quote(v)) for k, v in sorted(env.items())])

def _single(target_or_list):
    return target_or_list[0] if type(target_or_list) == "list" else target_or_list

def _rvv_qemu_test_impl(ctx):
    binary = _single(ctx.attr.binary)[DefaultInfo].files_to_run.executable
    cpu = ["rv64", "v=true", "vext_spec=v1.0", "rvv_ta_all_1s=true", "rvv_ma_all_1s=true"]
    cpu += ["%s=true" % ext for ext in ctx.attr.cpu_extensions]
    runner = ctx.actions.declare_file(ctx.label.name + "_runner.sh")
    ctx.actions.expand_template(
        template = ctx.file._runner_template,
        output = runner,
        substitutions = {
            "%QEMU%": ctx.file._qemu.short_path,
            "%ORIGIN%": ctx.file._qemu_origin.short_path,
            "%BINARY%": binary.short_path,
            "%CPU_BASE%": ",".join(cpu),
            "%VLENS%": " ".join([str(v) for v in ctx.attr.vlens]),
            "%EXPECT_SIGILL%": "1" if ctx.attr.expect_sigill_without_vector else "0",
            "%PASS_WITHOUT_VECTOR%": "1" if ctx.attr.pass_without_vector else "0",
            "%ENV%": env_exports(ctx.attr.env),
        },
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = [binary, ctx.file._qemu, ctx.file._qemu_origin])
    return [DefaultInfo(executable = runner, runfiles = runfiles)]

rvv_qemu_test = rule(
    implementation = _rvv_qemu_test_impl,
    test = True,
    attrs = {
        "binary": attr.label(mandatory = True, executable = True, cfg = _riscv64_transition),
        "platform": attr.label(default = "//toolchains/platforms:linux_riscv64"),
        "vlens": attr.int_list(default = [128, 256, 512, 1024]),
        "cpu_extensions": attr.string_list(),
        "env": attr.string_dict(doc = "Environment of the emulated program."),
        "expect_sigill_without_vector": attr.bool(default = False),
        "pass_without_vector": attr.bool(
            default = False,
            doc = "Also run on a CPU without V, where the test must pass on the portable kernels.",
        ),
        "_runner_template": attr.label(
            default = "//toolchains/qemu:rvv_qemu_test_runner.sh.tpl",
            allow_single_file = True,
        ),
        "_qemu": attr.label(default = "@qemu//:qemu-riscv64", allow_single_file = True),
        "_qemu_origin": attr.label(default = "@qemu//:origin.txt", allow_single_file = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

_COMPILER_PLATFORMS = {
    "llvm": "//toolchains/platforms:linux_riscv64",
    "gcc": "//toolchains/platforms:linux_riscv64_gcc",
}

def rvv_cc_test(name, srcs, deps = [], copts = [], compilers = ["llvm", "gcc"], vlens = None, cpu_extensions = [],
                env = {}, expect_sigill_without_vector = False, pass_without_vector = False, args = [],
                size = "medium", tags = [], **kwargs):
    """A C++ test compiled for riscv64 (static) by each compiler in `compilers`
    (clang-19 and GCC 14 from the pinned root) and run under QEMU once per VLEN:
    targets NAME_llvm, NAME_gcc."""
    for compiler in compilers:
        variant = "%s_%s" % (name, compiler)
        cc_binary(
            name = variant + "_bin",
            srcs = srcs,
            deps = deps,
            copts = copts,
            linkopts = ["-static"],
            linkstatic = True,
            target_compatible_with = ["@platforms//cpu:riscv64"],
            tags = ["manual"],
            **kwargs
        )
        rvv_qemu_test(
            name = variant,
            binary = ":" + variant + "_bin",
            platform = _COMPILER_PLATFORMS[compiler],
            vlens = vlens if vlens != None else [128, 256, 512, 1024],
            cpu_extensions = cpu_extensions,
            env = env,
            expect_sigill_without_vector = expect_sigill_without_vector,
            pass_without_vector = pass_without_vector,
            args = args,
            size = size,
            tags = tags + ["qemu", compiler],
        )

def _riscv64_files_impl(ctx):
    # Re-exposed under <name>/: the host build of the same target has the same
    # short path, and both may meet in one runfiles tree.
    files = []
    for target in ctx.attr.srcs:
        for f in target[DefaultInfo].files.to_list():
            out = ctx.actions.declare_file(ctx.label.name + "/" + f.basename)
            ctx.actions.symlink(output = out, target_file = f)
            files.append(out)
    return [DefaultInfo(files = depset(files), runfiles = ctx.runfiles(files = files))]

riscv64_files = rule(
    implementation = _riscv64_files_impl,
    doc = "The outputs of `srcs` built for a riscv64 platform, usable as data of host targets.",
    attrs = {
        "srcs": attr.label_list(mandatory = True, cfg = _riscv64_transition),
        "platform": attr.label(default = "//toolchains/platforms:linux_riscv64"),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

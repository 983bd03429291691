"""cc_toolchain_config for cross-compiling to linux riscv64 with clang-19 or GCC.

One rule serves both compilers: they share the action set and differ only in
their tool paths, `-march` and include directories.
"""

load(
    "@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl",
    "feature",
    "flag_group",
    "flag_set",
    "tool_path",
    "with_feature_set",
)
load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")

_COMPILE_ACTIONS = [
    ACTION_NAMES.assemble,
    ACTION_NAMES.preprocess_assemble,
    ACTION_NAMES.c_compile,
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]

_CXX_ACTIONS = [
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]

_LINK_ACTIONS = [
    ACTION_NAMES.cpp_link_executable,
    ACTION_NAMES.cpp_link_dynamic_library,
    ACTION_NAMES.cpp_link_nodeps_dynamic_library,
]

def _flags(actions, flags, features = None):
    return flag_set(
        actions = actions,
        flag_groups = [flag_group(flags = flags)],
        with_features = [with_feature_set(features = features)] if features else [],
    )

def _impl(ctx):
    is_clang = ctx.attr.compiler == "clang"
    target = ["--target=riscv64-linux-gnu"] if is_clang else []
    if ctx.attr.sysroot:
        # The image carries GCC 14's crt files and libstdc++: take them from there.
        target = target + ["--gcc-toolchain=%s/usr" % ctx.attr.sysroot]
    arch = ["-march=" + ctx.attr.march, "-mabi=lp64d"]
    linker = ["-fuse-ld=lld"] if is_clang else []

    # Objects must not depend on when they were built; the wrappers map the
    # execution root to `.` and fix SOURCE_DATE_EPOCH (where and when).
    reproducible = [
        "-Wno-builtin-macro-redefined",
        "-D__DATE__=\"redacted\"",
        "-D__TIMESTAMP__=\"redacted\"",
        "-D__TIME__=\"redacted\"",
    ]

    default_flags = feature(
        name = "default_flags",
        enabled = True,
        flag_sets = [
            _flags(_COMPILE_ACTIONS, target + arch + ["-fPIC", "-Wall", "-Wextra", "-fno-omit-frame-pointer"] + reproducible),
            _flags(_CXX_ACTIONS, ["-std=c++17"]),
            _flags(_LINK_ACTIONS, target + arch + linker + ["-lstdc++", "-lm"]),
            _flags(_COMPILE_ACTIONS, ["-O2", "-DNDEBUG"], ["opt"]),
            _flags(_COMPILE_ACTIONS, ["-O0", "-g"], ["dbg"]),
            _flags(_COMPILE_ACTIONS, ["-O1", "-g"], ["fastbuild"]),
        ],
    )
    features = [
        default_flags,
        feature(name = "opt"),
        feature(name = "dbg"),
        feature(name = "fastbuild"),
        feature(name = "supports_pic", enabled = True),
        feature(name = "supports_dynamic_linker", enabled = True),
    ]

    tools = ctx.attr.tools
    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        features = features,
        cxx_builtin_include_directories = ctx.attr.include_directories,
        toolchain_identifier = "riscv64-linux-%s" % ctx.attr.compiler,
        host_system_name = "x86_64-linux-gnu",
        target_system_name = "riscv64-linux-gnu",
        target_cpu = "riscv64",
        target_libc = "glibc",
        compiler = ctx.attr.compiler,
        abi_version = "lp64d",
        abi_libc_version = "glibc",
        tool_paths = [tool_path(name = name, path = path) for name, path in tools.items()],
        builtin_sysroot = ctx.attr.sysroot or None,
    )

riscv64_cc_toolchain_config = rule(
    implementation = _impl,
    attrs = {
        "compiler": attr.string(mandatory = True, values = ["clang", "gcc"]),
        "march": attr.string(mandatory = True),
        "tools": attr.string_dict(mandatory = True),
        "include_directories": attr.string_list(mandatory = True),
        "sysroot": attr.string(doc = "Build against this root (the riscv64 image) instead of the cross sysroot."),
    },
    provides = [CcToolchainConfigInfo],
)

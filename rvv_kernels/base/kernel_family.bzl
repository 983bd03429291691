"""What every kernel family's BUILD file shares: its vector sets, the library that
dispatches between them, its test pair and its benchmark.

A family (rvv_kernels/<family>/) has an RVV set built with
V, x86 sets built per ISA level, a portable set, and one library that picks the best
set the CPU reports at run time; its test runs on the host and under QEMU at every
VLEN; its benchmark is built for the host and, statically, for riscv64.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")
load("//toolchains/qemu:rvv_test.bzl", "riscv64_files", "rvv_cc_test")

HOST_X86 = "@platforms//cpu:x86_64"
RISCV64 = "@platforms//cpu:riscv64"

# The x86 ISA levels a generic-vector source is built at, and their flags.
SIMD_LEVELS = {
    "avx2": ["-mavx2", "-mfma"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-Wno-maybe-uninitialized"],
}

# What tells a dispatching library which sets exist in this build.
HAVE_SETS_DEFINES = select({
    RISCV64: ["RVASCEND_HAVE_RVV"],
    HOST_X86: ["RVASCEND_HAVE_X86_VARIANTS"],
    "//conditions:default": [],
})

def rvv_kernel_set(name, srcs, hdrs = [], deps = [], local_defines = []):
    """The family's RVV set: the only code built with V, run after the CPU reported it."""
    cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        copts = ["-O3", "-march=rv64gcv"],
        local_defines = local_defines,
        target_compatible_with = [RISCV64],
        deps = ["//rvv_kernels/base", "//rvv_kernels/base:rvv"] + deps,
        alwayslink = True,
    )

def simd_kernel_sets(src, hdrs = [], defines = {}, deps = ["//rvv_kernels/base"], prefix = "simd_"):
    """One generic-vector source as one library per SIMD_LEVELS entry (<prefix><level>);
    `defines[level]` names the level's symbols."""
    for level, copts in SIMD_LEVELS.items():
        cc_library(
            name = prefix + level,
            srcs = [src],
            hdrs = hdrs,
            copts = ["-O3", "-Wno-psabi"] + copts,
            local_defines = defines.get(level, []),
            target_compatible_with = [HOST_X86],
            deps = deps,
            alwayslink = True,
        )

def dispatching_library(name, srcs, hdrs, riscv64_sets, x86_sets, deps = [], linkopts = []):
    """The family's library: its driver and portable code, linked with the vector sets of
    the target it is built for."""
    cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        copts = ["-O3"],
        linkopts = linkopts,
        local_defines = HAVE_SETS_DEFINES,
        deps = ["//rvv_kernels/base"] + deps + select({
            RISCV64: riscv64_sets,
            HOST_X86: x86_sets,
            "//conditions:default": [],
        }),
        alwayslink = True,
    )

def kernel_tests(name, src, lib, env = {}, pass_without_vector = True):
    """<name>_host_test on the host and <name>_rvv_test under QEMU at every VLEN (both
    compilers), from one test source."""
    cc_test(
        name = name + "_host_test",
        size = "small",
        srcs = [src],
        deps = [lib],
    )
    rvv_cc_test(
        name = name + "_rvv_test",
        srcs = [src],
        env = env,
        pass_without_vector = pass_without_vector,
        deps = [lib],
    )

def kernel_bench(name, src, lib, gcc = False):
    """The benchmark for the host, and <name>_riscv64 (with gcc, <name>_riscv64_gcc too):
    static, so QEMU runs it without an image."""
    cc_binary(
        name = name,
        srcs = [src],
        linkopts = ["-static"],
        deps = [lib],
    )
    riscv64_files(
        name = name + "_riscv64",
        srcs = [":" + name],
    )
    if gcc:
        riscv64_files(
            name = name + "_riscv64_gcc",
            srcs = [":" + name],
            platform = "//toolchains/platforms:linux_riscv64_gcc",
        )

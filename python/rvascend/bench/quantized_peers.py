"""Quantized Linear on RVV against ggml's RVV paths, counted side by side under QEMU
(`./dev bench --parts=quantized_peers`): instructions per weight of one M = 1
product, at VLEN 128 / 256 / 512.

Ours: `rvv_kernels/quantized:quantized_linear_bench` (clang-19 and GCC 14 builds),
the whole call counted (activation quantization, every tile, the BF16 stores) and
the kernel alone. ggml's: `ggml_gemv_*_16x1` (its repacked path, repack.cpp) and
`ggml_vec_dot_*` (its row-by-row path, quants.c), built from llama.cpp's source
inside the pinned llama-cpp-python source distribution with the pinned
compilers (clang-19 for repack.cpp; GCC 14 for quants.c, whose inline assembly
clang-19 rejects) for rv64gcv + Zvfh (their kernels need it; ours do not), driven
by `rvv_kernels/quantized/bench/ggml_peer_gemv.cc`. Nothing of ggml is kept in
this repository. The count of ggml's functions includes the row loop that calls
them (one call per output row for vec_dot) but not its activation quantization.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from absl import app, flags, logging

from rvascend import checkout
from rvascend.bench.qemu_exec_count import count, function_ranges
from rvascend.bench.results import print_table, write_jsonl
from rvascend.setup import llama_cpp, toolchain_root
from rvascend.testing import llama_cpp as peer

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("vlens", ["128", "256", "512"], "VLENs to count at.")
    flags.DEFINE_list("formats", [], "Formats to count (default: every pair below).")
    flags.DEFINE_integer("n", 2048, "Output features.")
    flags.DEFINE_integer("k", 2048, "Input features.")
    flags.DEFINE_string("output", "bench_results/quantized_peers.jsonl", "jsonl file to append to.")


# (our format, ggml's functions for it)
_PAIRS = (("Q4_0", ("gemv_q4_0_16x1_q8_0", "vec_dot_q4_0_q8_0")),
          ("Q8_0", ("gemv_q8_0_16x1_q8_0", "vec_dot_q8_0_q8_0")),
          ("Q4_K", ("gemv_q4_K_16x1_q8_K", "vec_dot_q4_K_q8_K")),
          ("Q4_1", ()), ("Q6_K", ("vec_dot_q6_K_q8_K",)),
          ("Q5_0", ("vec_dot_q5_0_q8_0",)), ("Q5_1", ("vec_dot_q5_1_q8_1",)),
          ("Q2_K", ("gemv_q2_K_16x1_q8_K", "vec_dot_q2_K_q8_K")), ("Q3_K", ("vec_dot_q3_K_q8_K",)),
          ("Q5_K", ("vec_dot_q5_K_q8_K",)), ("IQ4_NL", ("gemv_iq4_nl_16x1_q8_0", "vec_dot_iq4_nl_q8_0")),
          ("IQ4_XS", ("vec_dot_iq4_xs_q8_K",)))
_GGML_SOURCES = ("ggml/include/", "ggml/src/ggml-common.h", "ggml/src/ggml-impl.h", "ggml/src/ggml-quants.h",
                 "ggml/src/ggml-backend-impl.h", "ggml/src/ggml-cpu/")
_OURS_WHOLE = r"rvascend::"
_OURS_KERNEL = r"rvascend::.*(Chunk|Gemm\w*<|PortableGemm)"
_SKIP = r"Repack|main|Put(Nibbles|Bits|Crumbs)32|Codes5|Crumbs256|ScalesK3|ScalesIq4Xs|ScaleMinK4"  # the repack and its helpers


def _root_tool(root: str, work: str, tool: str, args: list[str]) -> None:
    """Runs a compiler of the pinned toolchain root (Debian 13) inside it, as the Bazel wrappers do."""
    subprocess.run(toolchain_root.command(tool, args, [work, "/tmp"], work, root), check=True)


def build_peer(work: str) -> str:
    """ggml's RVV quantized kernels and our driver of them, linked statically; the binary's path."""
    binary = os.path.join(work, "ggml_peer_gemv")
    if os.path.exists(binary):
        return binary
    repo = checkout.root()
    root = os.path.join(repo, ".deps", "toolchain_root")
    src = os.path.join(work, "src")
    sdist = llama_cpp.fetched_sdist()
    peer.extract_vendored(src, _GGML_SOURCES, sdist)
    harness = os.path.join(work, "ggml_peer_gemv.cc")
    with open(os.path.join(repo, "rvv_kernels", "quantized", "bench", "ggml_peer_gemv.cc"), "rb") as f, \
            open(harness, "wb") as out:
        out.write(f.read())
    inc = [f"-I{src}/ggml/include", f"-I{src}/ggml/src", f"-I{src}/ggml/src/ggml-cpu"]
    march, cpu = "-march=rv64gcv_zvfh", f"{src}/ggml/src/ggml-cpu/arch/riscv"
    logging.info("building ggml's RVV kernels from %s", sdist)
    _root_tool(root, work, "/usr/bin/clang++-19", ["--target=riscv64-linux-gnu", march, "-O3", "-DNDEBUG",
                                                   "-std=c++17", *inc, "-c", f"{cpu}/repack.cpp", "-o", "repack.o"])
    _root_tool(root, work, "/usr/bin/riscv64-linux-gnu-gcc-14", [march, "-O3", "-DNDEBUG", *inc, "-c",
                                                                   f"{cpu}/quants.c", "-o", "quants.o"])
    _root_tool(root, work, "/usr/bin/clang++-19", ["--target=riscv64-linux-gnu", march, "-O2", "-c", harness,
                                                   "-o", "harness.o"])
    # ggml's other entry points (its thread pool, asserts) are never called by the driver.
    _root_tool(root, work, "/usr/bin/clang++-19", ["--target=riscv64-linux-gnu", march, "-static", "-fuse-ld=lld",
                                                   "-Wl,--unresolved-symbols=ignore-all", "harness.o", "repack.o",
                                                   "quants.o", "-o", binary, "-lm"])
    return binary


def main(argv: list[str]) -> int:
    del argv
    repo = checkout.root()
    targets = ["//rvv_kernels/quantized:quantized_linear_bench_riscv64",
               "//rvv_kernels/quantized:quantized_linear_bench_riscv64_gcc"]
    subprocess.run(["bazel", "build", *targets], cwd=repo, check=True)
    ours = {"clang": os.path.join(repo, "bazel-bin/rvv_kernels/quantized/quantized_linear_bench_riscv64/"
                                        "quantized_linear_bench"),
            "gcc": os.path.join(repo, "bazel-bin/rvv_kernels/quantized/quantized_linear_bench_riscv64_gcc/"
                                      "quantized_linear_bench")}
    peer = build_peer(os.path.join(repo, ".deps", "llama_cpp", "ggml_rvv_peer"))
    qemu = os.path.join(repo, ".deps", "qemu", "usr", "bin", "qemu-riscv64")
    nm = "llvm-nm-19"
    n, k = FLAGS.n, FLAGS.k
    weights = n * k
    rows: list[dict[str, Any]] = []
    for vlen in (int(v) for v in FLAGS.vlens):
        cpu = f"rv64,v=true,vext_spec=v1.0,vlen={vlen}"
        for fmt, peer_fns in _PAIRS:
            if FLAGS.formats and fmt not in FLAGS.formats:
                continue
            args = [f"--format={fmt}", "--m=1", f"--n={n}", f"--k={k}", "--kernel_set=rvv"]
            for compiler, binary in ours.items():
                whole = count(binary, qemu, cpu, args, function_ranges(binary, nm, _OURS_WHOLE, _SKIP))
                kernel = count(binary, qemu, cpu, args, function_ranges(binary, nm, _OURS_KERNEL, _SKIP))
                rows.append({"bench": "quantized_instruction_count", "impl": f"rvascend ({compiler})", "format": fmt,
                             "function": "QuantizedLinear", "vlen": vlen, "n": n, "k": k,
                             "instructions": whole, "per_weight": whole / weights, "kernel_per_weight": kernel / weights})
            for fn in peer_fns:
                insns = count(peer, qemu, cpu + ",zvfh=true", [f"--fn={fn}", f"--n={n}", f"--k={k}"],
                              function_ranges(peer, nm, r"^ggml_(vec_dot|gemv)_"))
                rows.append({"bench": "quantized_instruction_count", "impl": "ggml", "format": fmt, "function": fn,
                             "vlen": vlen, "n": n, "k": k, "instructions": insns, "per_weight": insns / weights,
                             "kernel_per_weight": insns / weights})
            logging.info("VLEN %d %s counted", vlen, fmt)
    best = {}
    for r in rows:
        if r["impl"].startswith("rvascend"):
            key = (r["format"], r["vlen"])
            best[key] = min(best.get(key, float("inf")), r["per_weight"])
    for r in rows:
        r["ggml_over_ours"] = r["per_weight"] / best[(r["format"], r["vlen"])] if r["impl"] == "ggml" else None
    print_table(rows, [("format", "format", "s"), ("vlen", "VLEN", "d"), ("impl", "impl", "s"),
                       ("function", "function", "s"), ("per_weight", "insns/weight", ".4f"),
                       ("kernel_per_weight", "kernel only", ".4f"), ("ggml_over_ours", "ggml / ours", ".2f")])
    print(f"M = 1, N = {n}, K = {k}; ours: the whole call (activation quantization, tiles, BF16 stores); "
          "'ggml / ours' > 1: ggml executes that many times our instructions (best of our two compilers)")
    manifest = None
    try:
        from rvascend.repro import manifest as repro

        manifest = repro.capture()
    except ImportError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    write_jsonl(FLAGS.output, rows, manifest)
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main)

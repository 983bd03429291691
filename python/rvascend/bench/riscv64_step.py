"""Every instruction of a decode or prefill step on riscv64, by region and library, and a K1 projection.

  ./dev bench --parts=riscv64_step
  bazel run //tests/riscv64_image:step_profile -- --vlens=256

Inside the riscv64 image (Debian 13: python3.13, torch 2.6 with scalar ATen)
under QEMU with a counting TCG plugin (qemu_count_plugin.cc), one thread,
deterministic: the project's own model and engine on a checkpoint with
random BF16 weights in a real model's shapes (--shape: Qwen3-0.6B by default,
SmolLM2-135M, ...) at 1 and 2 layers (so per-layer and fixed costs separate
and extrapolate to the model's depth). Steps: decode at context 64 and 512
with M = 1 and 4 sequences, and prefill of one 16-, 64- and 256-token prompt
(full and the quantized modes; stock: 16, its rate per token does not depend on the
length). Modes: stock (no policy), linear (the policy with packed Linears
only), op_by_op (every kernel, each called from Python as the modules call
it), full (the policy as --enable-cpu-kernels installs it: a decode
step's layers in one native call), q4_0, q4_1 and q8_0 (full, on the same
weights exported to a GGUF of that type and kept quantized). All code is
counted: the interpreter, libtorch, libc, our extension. Output: a table per
step (instructions by region, share outside the Linears, projected K1 tok/s
at 1 and 8 threads, and at 8 threads with IPC 0.5; prefill: prompt tokens
per second), jsonl records with the manifest, and a stacked-bar plot per region.

QEMU: 10, built with TCG plugins from the pinned source (setup/qemu_plugins.py), with
the K1's extensions (k1_model.qemu_cpu: Zfh, Zvfh, no Zvfbf*, so the shift-widening
BF16 kernels run, as on the K1). The quantized files are this project's export or,
with --gguf_source=llama_cpp, the very files llama.cpp is counted on.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags, logging

from rvascend import checkout
from rvascend.bench import k1_model
from rvascend.bench import plugin_intervals
from rvascend.bench.step_kinds import draft_tokens, draft_vocab, turn_tokens
from rvascend.bench.step_summaries import speculative_summary, turn_summary
from rvascend.bench.results import print_table, write_jsonl

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_string("qemu", None, "A qemu-riscv64 that loads TCG plugins (default: QEMU 10 built with them, "
                        "setup/qemu_plugins.py).")
    flags.DEFINE_string("image", None, "riscv64 image root (default: .deps/riscv64_image).")
    flags.DEFINE_string("extension", None, "_rvv_kernels.so built for the image (default: built with Bazel).")
    flags.DEFINE_string("recurrent_gated_delta_rule_extension", None,
                        "_recurrent_gated_delta_rule.so (the op of hybrid models' DeltaNet layers) built for the "
                        "image (default: built with Bazel).")
    flags.DEFINE_string("plugin", None, "qemu_count_plugin .so (default: built with Bazel).")
    flags.DEFINE_string("package", None, "Directory holding the rvascend package (default: this source tree).")
    flags.DEFINE_list("vlens", ["256"], "VLENs of the emulated CPU.")
    flags.DEFINE_list("layers", ["1", "2"], "Model depths to run (two, to separate per-layer and fixed costs).")
    flags.DEFINE_list("modes", ["stock", "linear", "op_by_op", "full", "q4_0", "q8_0"],
                      "stock: no policy; linear: packed Linears only; op_by_op: every kernel, called module by "
                      "module; full: the policy as --enable-cpu-kernels installs it (fused decode step); "
                      "q4_0, q4_1, q8_0: full, on the same weights as a GGUF of that type kept quantized; "
                      "q4_k_m, q5_k_m, q3_k_m, q2_k, iq4_xs: full, on llama.cpp's file of that recipe "
                      "(--gguf_source=llama_cpp).")
    flags.DEFINE_list("contexts", ["64", "512"], "Context lengths of the decode step.")
    flags.DEFINE_list("rows", ["1", "4"], "Sequences decoding together (M).")
    flags.DEFINE_list("prefill_lens", ["16", "64", "256"], "Prompt lengths of the prefill steps counted (one "
                      "sequence; mode full and the quantized modes; empty: none).")
    flags.DEFINE_list("stock_prefill_lens", ["16"], "Prompt lengths of mode stock's prefill steps: scalar ATen "
                      "runs every prompt length at the same rate per token (SmolLM2-135M: 3.81, 3.86 and 3.81 "
                      "K1 tok/s at 16, 64 and 256 tokens), and a long stock prompt takes hours to emulate.")
    flags.DEFINE_string("shape", "qwen3-0.6b", "Whose shapes the random-weight checkpoint has "
                        "(engine/random_checkpoint.py SHAPES: qwen3-0.6b, smollm2-135m, ...).")
    flags.DEFINE_enum("gguf_source", "ours", ["ours", "llama_cpp"],
                      "Who writes the quantized modes' files: this project's exporter (every matrix in that type) or "
                      "llama.cpp's quantizer with its default recipe (bench/llama_cpp_peer.prepare_models: the "
                      "files llama.cpp is counted on by bench/llama_cpp_riscv64.py, for a same-file comparison).")
    flags.DEFINE_list("verify_drafts", [], "Speculative verify steps to count: K draft tokens per sequence "
                      "(kinds verifyK, and nextnK where the shape has an MTP head: its draft pass included), at "
                      "every context and row count, in the policy's modes; empty: none.")
    flags.DEFINE_integer("draft_vocab", 0, "nextnK steps: the MTP head drafts among the first N token ids only "
                         "(kind nextnKhN; its lm_head part is N rows); 0: the whole vocabulary.")
    flags.DEFINE_float("acceptance_length", 1.97, "Tokens a verify step yields per sequence for the net-speed "
                       "column (default: Qwen3.5-0.8B's MTP head at one draft token, vLLM #39680).")
    flags.DEFINE_list("turns", [], "Chat turns to count (mode full): CONTEXT:NEW, NEW prompt tokens prefilled after "
                      "CONTEXT tokens the prefix cache holds (kind turnNEW).")
    flags.DEFINE_integer("target_layers", None, "Layers to extrapolate to (default: the shape's own, Qwen3-0.6B 28).")
    flags.DEFINE_string("output", "bench_results/riscv64_step.jsonl", "jsonl file to append to.")
    flags.DEFINE_string("plot", "bench_results/riscv64_step.png", "PNG plot (empty: none).")


# Weight bytes per weight in each quantized mode (GGML's Q4_0: 18 bytes per 32, Q4_1: 20, Q8_0: 34).
_BYTES_PER_WEIGHT = {"q4_0": 18 / 32, "q4_1": 20 / 32, "q8_0": 34 / 32}
# The recipes only llama.cpp's quantizer writes (mixes of K-quants and i-quants): counted on
# its files (--gguf_source=llama_cpp), their bytes per weight read from those files.
_LLAMA_CPP_RECIPES = ("q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "iq4_xs")
_QUANTIZED_MODES = (*_BYTES_PER_WEIGHT, *_LLAMA_CPP_RECIPES)
_MODE_ARG = {"stock": "off", "linear": "linear", "op_by_op": "op_by_op", "full": "full",
             **{mode: "full" for mode in _QUANTIZED_MODES}}
HYBRID_LINEARS = ("in_proj", "out_proj")  # Gated DeltaNet layers' (Qwen3.5)
LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head") + HYBRID_LINEARS
# Library of a mapped file, by name prefix (the image maps versioned sonames).
LIBRARY_PREFIXES = (("libtorch_cpu", "libtorch_cpu"), ("libtorch_python", "libtorch_python"),
                    ("libc10", "libc10"), ("libc.so", "libc"), ("libm.so", "libm"),
                    ("libstdc++", "libstdc++"), ("libgomp", "libgomp"), ("libblas", "libblas"),
                    ("libopenblas", "libblas"), ("_rvv_kernels", "rvascend kernels"),
                    ("python3", "python"), ("libpython3", "python"), ("ld-linux", "ld.so"))


def library_of(path: str) -> str:
    base = os.path.basename(path)
    for prefix, name in LIBRARY_PREFIXES:
        if base.startswith(prefix):
            return name
    return "python extensions" if base.endswith(".so") or ".cpython-" in base else "other"


def _bazel_outputs() -> tuple[str, str, str]:
    targets = ["//python:rvv_kernels_extension_riscv64_image", "//python:qemu_count_plugin.so",
               "//python:recurrent_gated_delta_rule_extension_riscv64_image"]
    from rvascend.setup import steps

    bin_dir = steps.bazel_bin(targets)
    return (os.path.join(bin_dir, "python", "rvv_kernels_extension_riscv64_image", "_rvv_kernels.so"),
            os.path.join(bin_dir, "python", "qemu_count_plugin.so"),
            os.path.join(bin_dir, "python", "recurrent_gated_delta_rule_extension_riscv64_image",
                         "_recurrent_gated_delta_rule.so"))


def _check_qemu(qemu: str) -> str:
    version = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    if not re.search(r"version [0-9]", version):
        raise RuntimeError(f"{qemu} did not report a version")
    return version


def _page_libraries(maps: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    spans = []
    for span, path in maps:
        lo, hi = (int(x, 16) >> 12 for x in span.split("-"))
        spans.append((lo, hi, library_of(path)))
    return sorted(spans)


def _library(page: int, spans: list[tuple[int, int, str]]) -> str:
    for lo, hi, name in spans:
        if lo <= page < hi:
            return name
    return "other"


def _sum(intervals, ids, spans) -> tuple[int, int, dict[str, int]]:
    total = vector = 0
    libs: dict[str, int] = collections.Counter()
    for i in ids:
        for page, (n, v) in intervals.get(i, {}).items():
            total += n
            vector += v
            libs[_library(page, spans)] += n
    return total, vector, dict(libs)


def _gguf_type(mode: str):
    import gguf

    return gguf.GGMLQuantizationType[mode.upper()]


def _llama_cpp_files(shape: str, modes: list[str], layers: list[int], target_layers: int
                     ) -> tuple[dict[tuple[str, int], str], dict[str, float]]:
    """llama.cpp's quantized files of `shape` at each measured depth, and each mode's bytes per
    weight as a decode step of the full-depth file streams them (its recipe mixes types:
    the output matrix stays in Q6_K for Q4_0)."""
    from rvascend.bench import llama_cpp_peer
    from rvascend.testing import llama_cpp
    from rvascend.models import random_checkpoint

    work, python, threads = llama_cpp.work_dir(), llama_cpp.python_path(), len(os.sched_getaffinity(0))
    files = {(mode, n): llama_cpp_peer.prepare_models(work, [shape], [mode], python, threads, layers=n)[f"{shape} {mode}"]
             for mode in modes for n in layers}
    config = random_checkpoint.SHAPES[shape]
    weights = sum(k1_model.unavoidable_bytes(r, config, 0, target_layers, bytes_per_weight=1.0) for r in LINEARS)
    full = llama_cpp_peer.prepare_models(work, [shape], modes, python, threads, layers=target_layers)
    return files, {mode: llama_cpp_peer.decode_step_bytes(full[f"{shape} {mode}"]) / weights for mode in modes}


def run_guest(qemu: str, image: str, stage: str, plugin: str, checkpoint: str, mode: str,
              configs: list[tuple[int, int]], vlen: int, tmp: str) -> list[dict[str, Any]]:
    """One guest process: every (context, rows) config of one model and mode."""
    out = os.path.join(tmp, f"counts-{mode}-{os.path.basename(checkpoint)}-{vlen}.txt")
    cpu = k1_model.qemu_cpu(vlen)
    args = json.dumps({"checkpoint": checkpoint, "mode": _MODE_ARG[mode], "configs": configs,
                       "keep_quantized": mode in _QUANTIZED_MODES})
    cmd = [qemu, "-plugin", f"{plugin},out={out}", "-L", image, "-cpu", cpu, f"{image}/usr/bin/python3.13", "-B",
           os.path.join(stage, "rvascend", "bench", "riscv64_step_guest.py"), args]
    env = dict(os.environ, PYTHONPATH=stage, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"guest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    logging.info("  %s, %s: %.0f s under QEMU", mode, os.path.basename(checkpoint), time.monotonic() - start)
    lines = proc.stdout.splitlines()
    maps = json.loads(next(line for line in lines if line.startswith("MAPS "))[5:])
    spans = _page_libraries(maps)
    parsed = plugin_intervals.read(out)
    intervals = parsed.pages
    steps = []
    for line in lines:
        if not line.startswith("STEP "):
            continue
        step = json.loads(line[5:])
        total, vector, libs = _sum(intervals, [step["total_interval"]], spans)
        regions: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        region_libs: dict[str, dict[str, int]] = collections.defaultdict(collections.Counter)
        region_kinds: dict[str, dict[str, int]] = collections.defaultdict(collections.Counter)
        first, last = step["marked_first_interval"], step["marked_last_interval"]
        for i, name in zip(range(first, last + 1), step["regions"]):
            n, v, by_lib = _sum(intervals, [i], spans)
            regions[name][0] += n
            regions[name][1] += v
            for lib, c in by_lib.items():
                region_libs[name][lib] += c
            region_kinds[name].update(parsed.kinds.get(i, {}))
        marked = sum(n for n, _ in regions.values())
        steps.append({"context": step["context"], "rows": step["rows"], "kind": step.get("kind", "decode"),
                      "mode": mode, "total": total,
                      "vector": vector, "libraries": libs, "regions": {k: tuple(v) for k, v in regions.items()},
                      "region_libraries": {k: dict(v) for k, v in region_libs.items()},
                      "region_kinds": {k: dict(v) for k, v in region_kinds.items()},
                      "marker_overhead": marked - total})
    return steps


# Regions a step runs once whatever its depth. Their counts move by some ten thousand
# instructions between two guest runs (the interpreter's allocations), which a linear
# fit over depths 1 and 2 would multiply by the model's depth: they take the mean of
# the two runs instead.
FIXED_REGIONS = ("embedding", "engine", "lm_head", "model_glue", "rotary", "sampling")


def extrapolate(one: dict[str, Any], two: dict[str, Any], layers: int, measured: tuple[int, int] = (1, 2)
                ) -> dict[str, Any]:
    """fixed + layers * per_layer from runs at the two `measured` depths (per region, per
    library), the FIXED_REGIONS as the two runs' mean; a hybrid model's depths are whole
    periods of its layer pattern."""
    n1, n2 = measured

    def ext(a: float, b: float) -> float:
        per_layer = (b - a) / (n2 - n1)
        return a - n1 * per_layer + layers * per_layer

    def fixed_part(run: dict[str, Any]) -> tuple[float, float, collections.Counter]:
        libs: collections.Counter = collections.Counter()
        for name in FIXED_REGIONS:
            libs.update(run["region_libraries"].get(name, {}))
        regions = [run["regions"].get(name, (0, 0)) for name in FIXED_REGIONS]
        return sum(n for n, _ in regions), sum(v for _, v in regions), libs

    def combine(a: float, b: float, fixed: bool) -> float:
        return (a + b) / 2 if fixed else ext(a, b)

    regions = {}
    for name in set(one["regions"]) | set(two["regions"]):
        a, b = one["regions"].get(name, (0, 0)), two["regions"].get(name, (0, 0))
        regions[name] = (combine(a[0], b[0], name in FIXED_REGIONS), combine(a[1], b[1], name in FIXED_REGIONS))

    def ext_libs(a: dict[str, float], b: dict[str, float], fixed: bool = False) -> dict[str, float]:
        return {k: combine(a.get(k, 0), b.get(k, 0), fixed) for k in set(a) | set(b)}

    region_libs = {name: ext_libs(one["region_libraries"].get(name, {}), two["region_libraries"].get(name, {}),
                                  name in FIXED_REGIONS) for name in regions}
    region_kinds = {name: ext_libs(one.get("region_kinds", {}).get(name, {}), two.get("region_kinds", {}).get(name, {}),
                                   name in FIXED_REGIONS) for name in regions}
    # The totals: the rest of each run extrapolated, the fixed regions' mean added.
    (fa, fva, la), (fb, fvb, lb) = fixed_part(one), fixed_part(two)
    rest = ext_libs({k: v - la.get(k, 0) for k, v in one["libraries"].items()},
                    {k: v - lb.get(k, 0) for k, v in two["libraries"].items()})
    fixed_libs = ext_libs(la, lb, fixed=True)
    libraries = {k: rest.get(k, 0) + fixed_libs.get(k, 0) for k in set(rest) | set(fixed_libs)}
    return {"total": ext(one["total"] - fa, two["total"] - fb) + (fa + fb) / 2,
            "vector": ext(one["vector"] - fva, two["vector"] - fvb) + (fva + fvb) / 2,
            "regions": regions, "libraries": libraries, "region_libraries": region_libs,
            "region_kinds": region_kinds,
            "marker_overhead": ext(one["marker_overhead"], two["marker_overhead"])}


def project(step: dict[str, Any], config: dict[str, Any], context: int, rows: int, layers: int,
            threads: int, bytes_per_weight: float = 2.0, ipc: float | None = None,
            prefill: bool = False, board: k1_model.Board = k1_model.ASSUMED) -> float:
    """K1 tok/s (decode: tokens generated; prefill: prompt tokens processed). Regions are
    scaled so they add up to the unmarked total (the markers' own cost removed in proportion)."""
    marked = sum(n for n, _ in step["regions"].values())
    scale = step["total"] / marked if marked else 1.0
    kinds = step.get("region_kinds", {})
    drafts, new = draft_tokens(step.get("kind", "decode")), turn_tokens(step.get("kind", "decode"))
    regions = [k1_model.Region(name, n * scale, v * scale,
                               k1_model.unavoidable_bytes(name, config, context * rows, layers,
                                                          bytes_per_weight=bytes_per_weight, sequences=rows,
                                                          tokens=1 + drafts, drafts=drafts,
                                                          draft_vocab=draft_vocab(step.get("kind", "decode"))),
                               {k: c * scale for k, c in kinds[name].items()} if kinds.get(name) else None)
               for name, (n, v) in step["regions"].items()]
    # Prefill: the prompt's tokens; a turn: its new tokens (the cached ones are read, as K/V); decode: one a sequence.
    produced = rows * context if prefill else rows * new if new else rows
    return k1_model.tokens_per_second(regions, produced, threads, ipc, board,
                                      produced if prefill or new else rows * (1 + drafts))


def project_record(record: dict[str, Any], threads: int, board: k1_model.Board) -> float:
    """project() of a stored record (its regions with their vector counts, its shape and bytes)."""
    from rvascend.models import random_checkpoint

    step = {"total": record["instructions"], "kind": record["kind"],
            "regions": {k: (n, record["region_vectors"][k]) for k, n in record["regions"].items()},
            "region_kinds": record.get("region_kinds", {})}
    config = random_checkpoint.SHAPES[record["shape"]]
    return project(step, config, record["context"], record["rows"], record["layers"], threads,
                   record["weight_bytes_per_weight"], prefill=record["kind"] == "prefill", board=board)


def _step_kinds(shape: dict[str, Any]):
    """The steps to count from the flags: decode configs (context, rows, "decode"), per mode
    the prefill, verify, MTP and turn steps, and the speculative kinds."""
    configs = [(int(c), int(m), "decode") for c in FLAGS.contexts for m in FLAGS.rows]
    full_prefills = [(int(p), 1, "prefill") for p in FLAGS.prefill_lens if p]
    prefills = {"full": full_prefills, **{mode: full_prefills for mode in _QUANTIZED_MODES},
                "stock": [(int(p), 1, "prefill") for p in FLAGS.stock_prefill_lens if p]}
    spec_kinds = [f"verify{k}" for k in FLAGS.verify_drafts]
    if shape.get("mtp_num_hidden_layers"):
        spec_kinds += [f"nextn{k}" + (f"h{FLAGS.draft_vocab}" if FLAGS.draft_vocab else "")
                       for k in FLAGS.verify_drafts]
    for mode in ("full", *_QUANTIZED_MODES):
        prefills[mode] = [(int(c), int(m), kind) for c in FLAGS.contexts for m in FLAGS.rows
                          for kind in spec_kinds] + prefills[mode]
    prefills["full"] = prefills["full"] + [(int(c), 1, f"turn{int(n)}") for c, n in
                                           (t.split(":") for t in FLAGS.turns)]
    return configs, prefills, spec_kinds


def _record(step: dict[str, Any], vlen: int, mode: str, kind: str, context: int, rows: int, target: int,
            config: dict[str, Any], layers: list[int], bpw: float) -> dict[str, Any]:
    """One counted step's record: its instructions and regions, and its K1 projections."""
    linear = sum(step["regions"].get(p, (0, 0))[0] for p in LINEARS)
    marked = sum(n for n, _ in step["regions"].values())
    record = {
        "bench": "riscv64_step", "shape": FLAGS.shape, "vlen": vlen, "mode": mode, "kind": kind,
        "context": context, "rows": rows,
        "layers": target, "instructions": step["total"], "vector_instructions": step["vector"],
        "regions": {k: v[0] for k, v in sorted(step["regions"].items())},
        "region_vectors": {k: v[1] for k, v in sorted(step["regions"].items())},
        "region_kinds": {k: dict(sorted(v.items())) for k, v in sorted(step["region_kinds"].items())
                         if v},
        "libraries": dict(sorted(step["libraries"].items())),
        "region_libraries": {k: dict(sorted(v.items(), key=lambda kv: -kv[1]))
                             for k, v in sorted(step["region_libraries"].items())},
        "marker_overhead": step["marker_overhead"],
        "share_outside_linears": 1 - linear / marked if marked else 0.0,
        "k1_tok_s_1_thread": project(step, config, context, rows, target, 1, bpw,
                                     prefill=kind == "prefill"),
        "k1_tok_s_8_threads": project(step, config, context, rows, target, k1_model.CORES, bpw,
                                      prefill=kind == "prefill"),
        "k1_tok_s_8_threads_ipc_0.5": project(step, config, context, rows, target,
                                              k1_model.CORES, bpw, ipc=0.5, prefill=kind == "prefill"),
        "weight_bytes_per_weight": bpw,
        "measured_layers": layers}
    for t in (4, 8):  # the board model fitted to measured boards (bench/calibration)
        record[f"k1_calibrated_tok_s_{t}_threads"] = project_record(record, t, k1_model.CALIBRATED)
    return record


def _print_tables(records: list[dict[str, Any]], speculative: bool, turns: list[dict[str, Any]]) -> None:
    """The steps' table, the speculative and turn summaries, and each step's largest regions."""
    print_table(records, [("vlen", "VLEN", "d"), ("mode", "mode", "s"), ("kind", "step", "s"),
                          ("context", "ctx/prompt", "d"), ("rows", "M", "d"),
                          ("instructions", "insns/step", ",.0f"), ("share_outside_linears", "outside Linear", ".1%"),
                          ("k1_tok_s_1_thread", "K1 tok/s 1T", ".2f"), ("k1_tok_s_8_threads", "K1 tok/s 8T", ".2f"),
                          ("k1_tok_s_8_threads_ipc_0.5", "8T, IPC 0.5", ".2f"),
                          ("k1_calibrated_tok_s_4_threads", "calibrated 4T", ".2f"),
                          ("k1_calibrated_tok_s_8_threads", "calibrated 8T", ".2f")])
    if speculative:
        print_table(speculative_summary(records, FLAGS.acceptance_length),
                    [("vlen", "VLEN", "d"), ("mode", "mode", "s"), ("kind", "step", "s"), ("context", "ctx", "d"),
                     ("rows", "M", "d"), ("insns_per_sequence_vs_decode", "insns / decode", ".3f"),
                     ("k1_time_vs_decode_4t", "K1 time / decode 4T", ".3f"),
                     ("k1_time_vs_decode_8t", "8T", ".3f"),
                     ("net_at_acceptance_4t", f"net x at {FLAGS.acceptance_length} 4T", ".2f"),
                     ("net_at_acceptance_8t", "8T", ".2f")])
    if turns:
        print_table(turns, [("vlen", "VLEN", "d"), ("cached", "cached", "d"), ("new", "new", "d"),
                            ("chunk", "chunk", "d"), ("turn_s_4t", "K1 turn s 4T", ".3f"),
                            ("whole_prompt_s_4t", "whole prompt s 4T", ".2f"), ("speedup_4t", "x 4T", ".1f"),
                            ("turn_s_8t", "turn s 8T", ".3f"), ("whole_prompt_s_8t", "whole s 8T", ".2f"),
                            ("speedup_8t", "x 8T", ".1f")])
    for r in records:
        top = sorted(r["regions"].items(), key=lambda kv: -kv[1])[:8]
        print(f"VLEN {r['vlen']} {r['mode']:6s} {r['kind']:7s} ctx {r['context']:4d} M {r['rows']}: " +
              ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in top))


def _quantized_files(tmp: str, checkpoints: dict[int, str], layers: list[int], target_layers: int):
    """(GGUF file by (mode, layers), bytes per weight by mode) of the quantized --modes: written
    here from the checkpoints, or llama.cpp's quantizer's (--gguf_source=llama_cpp)."""
    quantized, bytes_per_weight = {}, dict(_BYTES_PER_WEIGHT)
    quantized_modes = [m for m in FLAGS.modes if m in _QUANTIZED_MODES]
    recipes = [m for m in quantized_modes if m in _LLAMA_CPP_RECIPES]
    if recipes and FLAGS.gguf_source != "llama_cpp":
        raise app.UsageError(f"modes {', '.join(recipes)} are llama.cpp quantizer recipes: "
                             "add --gguf_source=llama_cpp")
    if FLAGS.gguf_source == "llama_cpp" and quantized_modes:
        quantized, bytes_per_weight = _llama_cpp_files(FLAGS.shape, quantized_modes, layers, target_layers)
    for mode in quantized_modes if FLAGS.gguf_source == "ours" else ():
        from rvascend.models import gguf_export

        for n in layers:  # the same weights, every projection and the embedding quantized
            quantized[(mode, n)] = os.path.join(tmp, f"model-{n}l-{mode}.gguf")
            logging.info("writing %s", quantized[(mode, n)])
            gguf_export.export(checkpoints[n], quantized[(mode, n)], default_type=_gguf_type(mode))
    return quantized, bytes_per_weight


def main(argv: list[str]) -> int:
    del argv
    from rvascend.models import random_checkpoint
    from rvascend.repro import manifest

    image = FLAGS.image or os.path.join(checkout.root(), ".deps", "riscv64_image")
    extension, plugin, rule_extension = FLAGS.extension, FLAGS.plugin, FLAGS.recurrent_gated_delta_rule_extension
    if extension is None or plugin is None or rule_extension is None:
        built_ext, built_plugin, built_rule = _bazel_outputs()
        extension, plugin, rule_extension = extension or built_ext, plugin or built_plugin, rule_extension or built_rule
    from rvascend.setup import qemu_plugins

    qemu = FLAGS.qemu or qemu_plugins.emulator(os.path.join(checkout.root(), ".deps"))
    qemu_version = _check_qemu(qemu)
    logging.info("QEMU: %s", qemu_version)
    unknown = [m for m in FLAGS.modes if m not in _MODE_ARG]
    if unknown:
        raise app.UsageError(f"unknown --modes {unknown}; known: {', '.join(_MODE_ARG)}")
    if FLAGS.shape not in random_checkpoint.SHAPES:
        raise app.UsageError(f"--shape must be one of {sorted(random_checkpoint.SHAPES)}, got {FLAGS.shape!r}")
    layers = [int(x) for x in FLAGS.layers]
    configs, prefills, spec_kinds = _step_kinds(random_checkpoint.SHAPES[FLAGS.shape])
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        stage = os.path.join(tmp, "stage")
        shutil.copytree(os.path.join(FLAGS.package or os.path.join(checkout.root(), "python"), "rvascend"),
                        os.path.join(stage, "rvascend"), ignore=shutil.ignore_patterns("*.so", "_native", "__pycache__"))
        shutil.copy(extension, os.path.join(stage, "rvascend", "ops", "_rvv_kernels.so"))
        shutil.copy(rule_extension, os.path.join(stage, "rvascend", "ops", "_recurrent_gated_delta_rule.so"))
        target_layers = FLAGS.target_layers or random_checkpoint.SHAPES[FLAGS.shape]["num_hidden_layers"]
        checkpoints = {n: random_checkpoint.write(FLAGS.shape, os.path.join(tmp, f"model-{n}l"), layers=n)
                       for n in layers}
        quantized, bytes_per_weight = _quantized_files(tmp, checkpoints, layers, target_layers)
        with open(os.path.join(checkpoints[layers[0]], "config.json")) as f:
            config = json.load(f)
        for vlen in (int(v) for v in FLAGS.vlens):
            measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for mode in FLAGS.modes:
                for n in layers:
                    logging.info("VLEN %d, %s, %d layer(s): %d steps", vlen, mode, n, len(configs))
                    measured[(mode, n)] = run_guest(qemu, image, stage, plugin,
                                                    quantized.get((mode, n), checkpoints[n]), mode,
                                                    configs + prefills.get(mode, []), vlen, tmp)
            for mode in FLAGS.modes:
                mode_configs = configs + prefills.get(mode, [])
                for i, (context, rows, kind) in enumerate(mode_configs):
                    runs = [measured[(mode, n)][i] for n in layers]
                    step = extrapolate(runs[0], runs[1], target_layers, (layers[0], layers[1])) \
                        if len(runs) == 2 else runs[0]
                    target = target_layers if len(runs) == 2 else layers[0]
                    step["kind"] = kind
                    records.append(_record(step, vlen, mode, kind, context, rows, target, config, layers,
                                           bytes_per_weight.get(mode, 2.0)))
    turns = turn_summary(records)
    _print_tables(records, bool(spec_kinds), turns)
    write_jsonl(FLAGS.output, records + [{"bench": "riscv64_step", "shape": FLAGS.shape, "turn_summary": t}
                                         for t in turns], manifest.capture(
        qemu_cpu=f"{qemu_version}: -cpu {k1_model.qemu_cpu(int(FLAGS.vlens[0]))} (VLEN {'|'.join(FLAGS.vlens)})"))
    if FLAGS.plot:
        from rvascend.bench.plots import stacked_region_plot
        stacked_region_plot(records, FLAGS.plot)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

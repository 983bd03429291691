"""llama.cpp counted on the emulated board (`./dev bench --parts=llama_cpp_riscv64`).

llama.cpp's own riscv64 build (setup/llama_cpp_riscv64.py: RVV with Zfh and Zvfh,
GCC 14, runtime repacking built in) runs inside the riscv64 image under QEMU 10 with
the counting plugin (setup/qemu_plugins.py, qemu_count_plugin.cc) at VLEN 256, on
random-weight GGUF files of the shapes in llama.cpp's public BPI-F3 tables, written
as bench/llama_cpp_peer.py writes them (this project's exporter, then llama.cpp's
own quantizer with its default recipe).

The driver (llama_cpp_count_driver.cc) does what llama-bench's pp and tg tests do
and marks every call, so a prompt and each generated token are counted by
themselves, start-up and loading apart. Variants: `repack` (llama.cpp's default:
weights repacked at load for its GEMV/GEMM tiles where it has them for the type)
and `vec_dot` (repacking off: the row-by-row dot products), as the PRs report both.

Lengths: the whole model runs once with a --base-prompt prompt (64) and --generate
tokens; a one-unit model of the same shape and type runs at every prompt length of
--prompts, and a two-unit one at every length of --prefill-prompts, a unit being one
layer, or one period of a hybrid's layer pattern (Qwen3.5: three Gated DeltaNet layers
and one of full attention; depth_unit) (bench/llama_cpp_riscv64.compose gives the whole
model's count at each: the second unit is what each unit but the last costs, since
llama.cpp's last layer runs its feed-forward for the output token alone). A model of
real weights (SmolLM2, the served default) cannot be cut: its unit is the whole model,
run at every prompt length. Decode contexts are those prompts plus the
generated tokens (the cache holds that many once the last token is in). The first
generated token after a prompt also pays the graph's re-planning for one-token
batches: the last one is the decode figure.

Threads: the work a guest thread does is counted per thread. On this emulator the
threads' waiting is emulated too, so the instructions a run at N threads executes
beyond the one-thread run are the synchronisation and spinning it adds (their
amount depends on the host's scheduling, not the board's: they are reported, not
projected from).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags, logging

from rvascend import checkout
from rvascend.bench import k1_model
from rvascend.bench import plugin_intervals
from rvascend.bench.results import print_table, write_jsonl

FLAGS = flags.FLAGS
VARIANTS = ("repack", "vec_dot")


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("models", ["tinyllama-1.1b"], "Random-weight models (bench/llama_cpp_peer.py's names).")
    flags.DEFINE_list("types", ["q4_0", "q8_0", "q4_k_m", "q2_k", "iq4_nl"], "GGUF types (llama.cpp's quantizer).")
    flags.DEFINE_list("variants", list(VARIANTS), "repack (llama.cpp's default) and/or vec_dot (repacking off).")
    flags.DEFINE_list("threads", ["1"], "Guest threads of each count (1 is always counted first).")
    flags.DEFINE_integer("base-prompt", 64, "The whole model's prompt length.")
    flags.DEFINE_list("prompts", ["16", "32", "62", "64", "128", "256", "510", "512"],
                      "The one-layer model's prompt lengths (must include --base-prompt); a decode context is one "
                      "of them plus --generate.")
    flags.DEFINE_list("prefill-prompts", ["16", "32", "64", "128", "256", "512"],
                      "The prompt lengths counted for prefill (a two-layer model runs each; must be among --prompts "
                      "and include --base-prompt).")
    flags.DEFINE_string("reuse", None, "A jsonl of earlier records: their runs of the same file, variant, VLEN and "
                        "llama.cpp build are taken instead of being counted again.")
    flags.DEFINE_integer("generate", 2, "Tokens generated after each prompt (the last is the decode figure).",
                         lower_bound=2)
    flags.DEFINE_integer("vlen", 256, "VLEN of the emulated CPU (the K1's is 256).")
    flags.DEFINE_string("work-dir", None, "GGUF files and the riscv64 build (default: .deps/llama_cpp).")
    flags.DEFINE_string("output", "bench_results/llama_cpp_riscv64.jsonl", "jsonl file to append to.")


@dataclasses.dataclass
class CountedRun:
    """One driver run: the prompt's count, each generated token's, per-thread splits and
    vector instructions by kind (qemu_count_plugin.cc's kinds)."""
    prompt: int
    prompt_counts: tuple[int, int]            # (instructions, vector instructions)
    token_counts: list[tuple[int, int]]
    prompt_threads: dict[int, tuple[int, int]]
    token_threads: list[dict[int, tuple[int, int]]]
    prompt_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    token_kinds: list[dict[str, int]] = dataclasses.field(default_factory=list)


def run_counted(qemu: str, plugin: str, image: str, driver: str, gguf: str, threads: int, prompt: int,
                generate: int, repack: bool, vlen: int, tmp: str) -> CountedRun:
    """Runs the driver once under the counting plugin; its intervals read back."""
    out = os.path.join(tmp, f"counts-{os.getpid()}-{time.monotonic_ns()}.txt")
    cmd = [qemu, "-plugin", f"{plugin},out={out}", "-L", image, "-cpu", k1_model.qemu_cpu(vlen), driver,
           f"--model={gguf}", f"--threads={threads}", f"--prompt={prompt}", f"--generate={generate}"]
    if not repack:
        cmd.append("--no-repack")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or "DONE" not in proc.stdout:
        raise RuntimeError(f"llama.cpp driver failed ({proc.returncode}) on {gguf}:\n{proc.stderr[-3000:]}")
    return parse_run(out, prompt, generate)


def parse_run(path: str, prompt: int, generate: int) -> CountedRun:
    """Intervals: start-up and loading, the prompt, one per generated token, exit."""
    intervals = plugin_intervals.read(path)
    totals = intervals.totals()
    threads, kinds = intervals.threads, intervals.kinds
    expected = 1 + (1 if prompt else 0) + generate + 1
    if len(totals) != expected:
        raise RuntimeError(f"{path}: {len(totals)} intervals, expected {expected} (prompt {prompt}, "
                           f"{generate} tokens)")
    first = 2 if prompt else 1
    return CountedRun(prompt=prompt, prompt_counts=totals[1] if prompt else (0, 0),
                      token_counts=totals[first:first + generate],
                      prompt_threads=threads.get(1, {}) if prompt else {},
                      token_threads=[threads.get(i, {}) for i in range(first, first + generate)],
                      prompt_kinds=kinds.get(1, {}) if prompt else {},
                      token_kinds=[kinds.get(i, {}) for i in range(first, first + generate)])


def _decode(run: CountedRun) -> tuple[int, int]:
    """A generated token's count: the last one (the first after a prompt also pays the
    graph's re-planning for one-token batches)."""
    return run.token_counts[-1]


def _context(run: CountedRun) -> int:
    """Tokens in the cache once the last generated token is in it."""
    return run.prompt + len(run.token_counts)


@dataclasses.dataclass(frozen=True)
class Composed:
    """The whole model's counts at every measured length: prefill by prompt length and decode
    by context, each (instructions, vector instructions), and their vector instructions by kind."""
    layers: int
    prefill: dict[int, tuple[float, float]]
    decode: dict[int, tuple[float, float]]
    prefill_kinds: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    decode_kinds: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # The composed prompt at the whole model's own length / its count - 1, before the composed
    # prompts were brought to that count (compose's last step).
    prefill_check: float = 0.0


def depth_unit(config: dict[str, Any]) -> int:
    """Layers in one period of the model's layer pattern: 1 when every layer is of one kind, 4
    for Qwen3.5 (three Gated DeltaNet layers, then one of full attention)."""
    types = config.get("layer_types") or [None]
    return next(u for u in range(1, len(types) + 1)
                if len(types) % u == 0 and all(t == types[i % u] for i, t in enumerate(types)))


def compose(full: CountedRun, one_layer: list[CountedRun], two_layer: list[CountedRun], layers: int,
            unit: int = 1) -> Composed:
    """The whole model's counts at every length, from a one-unit and a two-unit model of the
    same shape and type (a unit: `unit` layers, depth_unit; the text below says layer for it).

    A prompt: llama.cpp's last layer runs its feed-forward and the lm_head for the output
    token alone (its graph keeps only the rows it outputs), so one layer's prompt count is a
    fixed part plus attention over the prompt, and the second layer is what every other layer
    costs: prefill(P) = one(P) + (layers - 1) (two(P) - one(P)), at the prompts both ran. The
    whole model's own prompt checks it (Composed.prefill_check) and sets it: a type whose recipe
    varies the type by layer (Q5_K_M gives Q6_K to the first and last eighth of the layers and
    every third between; IQ4_NL and Q3_K_M their own) gives a one- and a two-layer file another
    mix than the whole model's, a difference in weight work per prompt token, so the whole
    model's count at its prompt P0 corrects every prompt by P / P0 of the difference there.

    A token: every layer runs it through, so only attention grows with the context (llama.cpp
    reads the cache padded to 256 entries: its cost grows in steps):
    decode(c) = full(c0) + layers (one(c) - one(c0)).
    """
    if layers % unit:
        raise ValueError(f"{layers} layers are not whole units of {unit}")
    layers //= unit
    by_prompt = {r.prompt: r for r in one_layer}
    second = {r.prompt: r for r in two_layer}
    base = by_prompt.get(full.prompt)
    if base is None or len(full.token_counts) != len(base.token_counts) or full.prompt not in second:
        raise ValueError(f"the one- and two-layer runs need the full run's prompt length {full.prompt} and token count")

    def prompt_at(one: float, two: float) -> float:
        return one + (layers - 1) * (two - one)

    def token_at(whole: float, one: float, one_base: float) -> float:
        return whole + layers * (one - one_base)

    def by_kind(f, *kinds: dict[str, int]) -> dict[str, float]:
        """Kinds composed as the counts are; none when a run was counted without them."""
        if not all(kinds):
            return {}
        return {k: f(*(d.get(k, 0) for d in kinds)) for k in sorted(set().union(*kinds))}

    prefill, decode, prefill_kinds, decode_kinds = {}, {}, {}, {}
    for p, run in sorted(by_prompt.items()):
        if p in second:
            prefill[p] = tuple(prompt_at(run.prompt_counts[k], second[p].prompt_counts[k]) for k in (0, 1))
            prefill_kinds[p] = by_kind(prompt_at, run.prompt_kinds, second[p].prompt_kinds)
        c = _context(run)
        decode[c] = tuple(token_at(_decode(full)[k], _decode(run)[k], _decode(base)[k]) for k in (0, 1))
        decode_kinds[c] = by_kind(token_at, full.token_kinds[-1], run.token_kinds[-1], base.token_kinds[-1]) \
            if full.token_kinds and run.token_kinds and base.token_kinds else {}
    p0 = full.prompt
    check = prefill[p0][0] / full.prompt_counts[0] - 1
    at_p0, kinds_at_p0 = prefill[p0], prefill_kinds.get(p0, {})
    prefill = {p: tuple(v[k] + (full.prompt_counts[k] - at_p0[k]) * p / p0 for k in (0, 1)) for p, v in prefill.items()}
    if full.prompt_kinds and kinds_at_p0:
        prefill_kinds = {p: {k: kinds.get(k, 0) + (full.prompt_kinds.get(k, 0) - kinds_at_p0.get(k, 0)) * p / p0
                             for k in sorted(set(kinds) | set(full.prompt_kinds))} if kinds else {}
                         for p, kinds in prefill_kinds.items()}
    return Composed(layers * unit, prefill, decode, prefill_kinds, decode_kinds, check)


def composed_record(record: dict[str, Any]) -> Composed:
    """compose() over the runs a llama_cpp_riscv64 record keeps (its one-thread whole run)."""
    return compose(_run_from_json(record["full_runs"]["1"]), [_run_from_json(r) for r in record["one_layer_runs"]],
                   [_run_from_json(r) for r in record["two_layer_runs"]], record["layers"],
                   record.get("unit_layers", 1))


def thread_split(one: CountedRun, many: CountedRun) -> dict[str, Any]:
    """What N threads add over one, for the last generated token and the prompt: vector work
    (the same when the split is exact), the busiest thread's share of it, and the
    instructions beyond the one-thread run (synchronisation and spinning)."""
    def split(single: tuple[int, int], per_thread: dict[int, tuple[int, int]]) -> dict[str, Any]:
        total = sum(n for n, _ in per_thread.values())
        vector = sum(v for _, v in per_thread.values())
        return {"threads_seen": len(per_thread), "instructions": total, "vector_instructions": vector,
                "busiest_vector_share": max((v for _, v in per_thread.values()), default=0) / max(1, vector),
                "added_instructions": total - single[0], "added_share": (total - single[0]) / max(1, single[0])}

    return {"decode": split(one.token_counts[-1], many.token_threads[-1]),
            "prefill": split(one.prompt_counts, many.prompt_threads)}


def _run_from_json(d: dict[str, Any]) -> CountedRun:
    def threads(t: dict[str, list[int]]) -> dict[int, tuple[int, int]]:
        return {int(k): (v[0], v[1]) for k, v in t.items()}

    return CountedRun(d["prompt"], tuple(d["prompt_counts"]), [tuple(c) for c in d["token_counts"]],
                      threads(d["prompt_threads"]), [threads(t) for t in d["token_threads"]],
                      d.get("prompt_kinds", {}), d.get("token_kinds", []))


def reusable_runs(path: str, build: dict[str, Any], vlen: int, generate: int) -> dict[tuple, CountedRun]:
    """(model, type, variant, depth ("full", 1 or 2 units), threads, prompt) -> a run of an earlier
    record made by the same llama.cpp build at the same VLEN and token count."""
    runs: dict[tuple, CountedRun] = {}
    build = json.loads(json.dumps(build))  # as a record holds it: tuples are lists there
    with open(path, encoding="utf-8") as f:
        for record in (json.loads(line) for line in f):
            if record.get("bench") != "llama_cpp_riscv64" or record.get("vlen") != vlen \
                    or record.get("generate") != generate or record.get("manifest", {}).get("llama_cpp") != build:
                continue
            key = (record["model"], record["type"], record["variant"])
            for t, run in record.get("full_runs", {}).items():
                runs[(*key, "full", int(t), run["prompt"])] = _run_from_json(run)
            for depth, name in ((1, "one_layer_runs"), (2, "two_layer_runs")):
                for run in record.get(name, []):
                    runs[(*key, depth, 1, run["prompt"])] = _run_from_json(run)
    return runs


def _record(model: str, kind: str, variant: str, layers: int, unit: int, base_prompt: int, gguf: str,
            composed, full: dict[int, "CountedRun"], singles: list["CountedRun"], pairs: list["CountedRun"]) -> dict:
    """One file's and variant's record: the composed prefill and decode counts and the runs."""
    from rvascend.bench import llama_cpp_peer

    decode_64 = composed.decode[min(composed.decode, key=lambda c: abs(c - 64))]
    return {
        "bench": "llama_cpp_riscv64", "model": model, "type": kind, "variant": variant,
        "vlen": FLAGS.vlen, "layers": layers, "unit_layers": unit, "base_prompt": base_prompt,
        "generate": FLAGS.generate,
        "prefill": {str(p): list(v) for p, v in composed.prefill.items()},
        "decode": {str(c): list(v) for c, v in composed.decode.items()},
        "prefill_kinds": {str(p): v for p, v in composed.prefill_kinds.items()},
        "decode_kinds": {str(c): v for c, v in composed.decode_kinds.items()},
        "prefill_check": composed.prefill_check,
        "file_bytes": os.path.getsize(gguf), "decode_weight_bytes": llama_cpp_peer.decode_step_bytes(gguf),
        "prefill_per_token_64": composed.prefill[base_prompt][0] / base_prompt,
        "decode_at_64": decode_64[0], "decode_vector_share": decode_64[1] / decode_64[0],
        "full_runs": {str(t): dataclasses.asdict(r) for t, r in full.items()},
        "one_layer_runs": [dataclasses.asdict(r) for r in singles],
        "two_layer_runs": [dataclasses.asdict(r) for r in pairs],
        "threads": {str(t): thread_split(full[1], r) for t, r in full.items() if t > 1}}


def main(argv: list[str]) -> int:
    del argv
    from rvascend.bench import llama_cpp_peer
    from rvascend.setup import llama_cpp_riscv64, qemu_plugins
    from rvascend.testing import llama_cpp
    from rvascend.repro import manifest

    work = FLAGS["work-dir"].value or llama_cpp.work_dir()
    deps = os.path.join(checkout.root(), ".deps")
    qemu = qemu_plugins.emulator(deps)
    plugin = qemu_plugins.count_plugin()
    driver = llama_cpp_riscv64.driver()
    image = os.path.join(deps, "riscv64_image")
    prompts = sorted({int(p) for p in FLAGS.prompts})
    prefill_prompts = sorted({int(p) for p in FLAGS["prefill-prompts"].value})
    base_prompt = FLAGS["base-prompt"].value
    thread_counts = sorted({1, *(int(t) for t in FLAGS.threads)})
    unknown = [v for v in FLAGS.variants if v not in VARIANTS]
    if unknown or base_prompt not in prompts or base_prompt not in prefill_prompts \
            or not set(prefill_prompts) <= set(prompts):
        raise app.UsageError(f"--variants from {VARIANTS}; --prompts must include --base-prompt {base_prompt} and "
                             "every --prefill-prompts length")
    threads_available = len(os.sched_getaffinity(0))
    from rvascend.models import random_checkpoint

    files = llama_cpp_peer.prepare_models(work, FLAGS.models, FLAGS.types, llama_cpp.python_path(), threads_available)
    # A model of real weights cannot be cut to fewer layers: its whole file is its one unit, run
    # at every prompt (compose then adds nothing to the counts).
    units = {m: random_checkpoint.SHAPES[m]["num_hidden_layers"] if m in llama_cpp_peer.REAL_WEIGHTS
             else depth_unit(random_checkpoint.SHAPES[m]) for m in FLAGS.models}
    shallow = {(m, n): llama_cpp_peer.prepare_models(work, [m], FLAGS.types, llama_cpp.python_path(),
                                                     threads_available, layers=n * units[m])
               for m in FLAGS.models for n in (1, 2) if n == 1 or m not in llama_cpp_peer.REAL_WEIGHTS}

    records = []
    captured = manifest.capture(qemu_cpu=f"{qemu}: -cpu {k1_model.qemu_cpu(FLAGS.vlen)}")
    captured["llama_cpp"] = {"llama_cpp_python": llama_cpp.lock()["version"], "build": llama_cpp_riscv64.CMAKE_OPTIONS}
    earlier = reusable_runs(FLAGS.reuse, captured["llama_cpp"], FLAGS.vlen, FLAGS.generate) if FLAGS.reuse else {}
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[tuple, CountedRun] = {}

        def count(key: tuple, gguf: str, threads: int, prompt: int, repack: bool) -> CountedRun:
            if (*key, threads, prompt) in earlier:
                return earlier[(*key, threads, prompt)]
            if (gguf, threads, prompt, repack) not in runs:  # a whole file's one unit is its full run too
                runs[(gguf, threads, prompt, repack)] = run_counted(qemu, plugin, image, driver, gguf, threads, prompt,
                                                                    FLAGS.generate, repack, FLAGS.vlen, tmp)
            return runs[(gguf, threads, prompt, repack)]

        for key, gguf in files.items():
            model, kind = key.split()
            layers = random_checkpoint.SHAPES[model]["num_hidden_layers"]
            for variant in FLAGS.variants:
                repack = variant == "repack"
                start = time.monotonic()
                full = {t: count((model, kind, variant, "full"), gguf, t, base_prompt, repack) for t in thread_counts}
                singles = [count((model, kind, variant, 1), shallow[(model, 1)][key], 1, p, repack) for p in prompts]
                pairs = [count((model, kind, variant, 2), shallow[(model, 2)][key], 1, p, repack)
                         for p in prefill_prompts] if (model, 2) in shallow else \
                    [r for r in singles if r.prompt in prefill_prompts]
                logging.info("%s %s %s: %.0f s under QEMU", model, kind, variant, time.monotonic() - start)
                composed = compose(full[1], singles, pairs, layers, units[model])
                if abs(composed.prefill_check) > 0.01:
                    logging.warning("%s %s %s: the composed %d-token prompt is %+.2f%% off the whole model's count",
                                    model, kind, variant, base_prompt, 100 * composed.prefill_check)
                records.append(_record(model, kind, variant, layers, units[model], base_prompt, gguf, composed,
                                       full, singles, pairs))
                write_jsonl(FLAGS.output, records[-1:], captured)  # each as it is counted: hours of emulation
    print_table(records, [("model", "model", "s"), ("type", "type", "s"), ("variant", "variant", "s"),
                          ("prefill_per_token_64", "prefill insns/token (P=64)", ",.0f"),
                          ("decode_at_64", "decode insns/token (ctx 64)", ",.0f"),
                          ("prefill_check", "composed/whole prompt - 1", "+.3%"),
                          ("decode_vector_share", "vector share", ".1%")])
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

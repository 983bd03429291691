"""llama.cpp as the measured peer (`./dev bench --parts=llama_cpp`).

The same GGUF files go to llama.cpp (llama-cpp-python built from its PyPI source by
`./dev setup`, rvascend/setup/llama_cpp.py) and to this engine, each in a fresh process with
the same thread count: SmolLM2-135M-Instruct (the default model, written back as BF16
GGUF), a random-weight Qwen3-0.6B-shaped checkpoint and a random-weight Qwen3.5-0.8B-shaped
one (the Gated DeltaNet hybrid, written by llama.cpp's own converter), each in BF16 and in Q8_0,
Q4_0 and Q4_K_M written from it by llama.cpp's quantizer (with the policy on, this engine
keeps those weights quantized where it has kernels for their types; off, it dequantizes
them to BF16). Batch 1 and 4, 64 tokens in
and 64 out, greedy: prefill tok/s, median decode tok/s, TTFT, peak RSS, and this
engine's ratios to llama.cpp. Beside them, the weights each engine streams in a decode
step (the file's matrices, tok/s times the bytes a step reads) as GB/s and as a fraction
of the copy bandwidth this engine's processes measured: at batch 1 both engines are bound
by it, so a ratio near 1.0 there is the host's ceiling, not a tie short of it. Every
step is timed by itself on both sides (llama_cpp_peer_guest.py; one_batch.py).
`--rounds` alternates fresh processes of the engines and takes medians; `--isa=avx2`
runs both engines as an AVX2-only host would.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from absl import app, flags, logging

from rvascend import checkout
from rvascend.setup import llama_cpp
from rvascend.testing import llama_cpp as peer
from rvascend.bench.plots import bar_plot
from rvascend.bench.results import print_table, write_jsonl

FLAGS = flags.FLAGS
MODELS = ("smollm2-135m", "qwen3-0.6b", "qwen3.5-0.8b")
TYPES = ("bf16", "q8_0", "q4_0", "q4_k_m")  # bf16, then what llama.cpp's quantizer writes from it
# Every type prepare_models can write (the riscv64 count adds the types of llama.cpp's public tables).
FILE_TYPES = (*TYPES, "q4_1", "q2_k", "q3_k_m", "q5_k_m", "iq4_nl", "iq4_xs")
# Models whose files hold real weights (SmolLM2: the served default's), which cannot be
# truncated to fewer layers; every other model is random weights in a real model's shapes.
REAL_WEIGHTS = ("smollm2-135m",)


def _define_flags() -> None:
    """This program's flags, defined when it runs (tests import several bench modules at once)."""
    flags.DEFINE_list("models", list(MODELS), f"Which models ({', '.join(MODELS)}).")
    flags.DEFINE_list("types", list(TYPES),
                      f"GGUF file types: bf16, and {' / '.join(FILE_TYPES[1:])} written from it by llama.cpp's "
                      "quantizer.")
    flags.DEFINE_list("batch-sizes", ["1", "4"], "Sequences per batch.")
    flags.DEFINE_integer("input-len", 64, "Prompt tokens per sequence.")
    flags.DEFINE_integer("output-len", 64, "Generated tokens per sequence.")
    flags.DEFINE_integer("repeats", 3, "Timed runs of each engine: median prefill, median decode step of all.",
                         lower_bound=1)
    flags.DEFINE_integer("rounds", 1, "Fresh processes of every engine in turn, per model and batch size (llama.cpp, "
                         "then each policy, then again): each figure is the median of the rounds' figures, peak RSS "
                         "the largest. Two runs of one engine minutes apart on a shared host differ by up to 10 %.",
                         lower_bound=1)
    flags.DEFINE_list("policy", ["off", "on", "drop"],
                      "This engine's runs: RVV policy off, on, and on with --cpu-kernels-drop-unpacked (drop).")
    flags.DEFINE_enum("isa", "native", ["native", "avx2"],
                      "x86 code both engines may run: native, or avx2 (an AVX2-only host's, on an AVX-512 one: "
                      "llama.cpp built for AVX2, and this engine with RVASCEND_MAX_ISA, ATEN_CPU_CAPABILITY and "
                      "ONEDNN_MAX_CPU_ISA capped at AVX2).")
    flags.DEFINE_integer("threads", None, "Threads for both engines (default: the CPUs this process may use).")
    flags.DEFINE_string("work-dir", None, "Venv and GGUF files (default: .deps/llama_cpp of the checkout).")
    flags.DEFINE_string("output", "bench_results/llama_cpp.jsonl", "jsonl file to append to.")
    flags.DEFINE_string("plot", "bench_results/llama_cpp.png", "PNG plot (empty: none).")


_HERE = os.path.dirname(os.path.abspath(__file__))
# What caps this engine's code at an ISA level: its own kernel sets, ATen's vector
# kernels and oneDNN's GEMMs.
ISA_ENVIRONMENT = {
    "native": {},
    "avx2": {"RVASCEND_MAX_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def prepare_models(work: str, names: list[str], types: list[str], python: str, threads: int,
                   layers: int | None = None) -> dict[str, str]:
    """"name type" -> GGUF file, written once: BF16 by this project's exporter, the
    quantized types from it by llama.cpp's quantizer (its default recipe). `layers`
    truncates a random-weight model to that many layers (files named -<layers>l); a
    model's own depth is its whole file."""
    from rvascend.models import random_checkpoint
    from rvascend.models import default_model
    from rvascend.models import gguf_checkpoint, gguf_export

    if layers is not None and all(random_checkpoint.SHAPES[n]["num_hidden_layers"] == layers
                                  for n in names if n in random_checkpoint.SHAPES):
        layers = None

    def smollm2(tmp: str, out: str) -> None:
        checkpoint = os.path.join(tmp, "checkpoint")
        gguf_checkpoint.convert(default_model.ensure_default_model(), checkpoint)
        gguf_export.export(checkpoint, out)

    def qwen3_5(shape: str):
        def write(tmp: str, out: str) -> None:
            # llama.cpp's converter writes this family (its value-head order, norms as 1 + w); it
            # needs a tokenizer it recognises: the default model's, padded to the vocabulary.
            checkpoint = random_checkpoint.write(shape, os.path.join(tmp, "checkpoint"), layers=layers)
            source = gguf_checkpoint.GgufCheckpoint(default_model.ensure_default_model())
            tokenizer_json, tokenizer_config = source.tokenizer_files()
            source.close()
            tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
            for name, content in (("tokenizer.json", tokenizer_json), ("tokenizer_config.json", tokenizer_config)):
                with open(os.path.join(checkpoint, name), "w", encoding="utf-8") as f:
                    json.dump(content, f)
            script = peer.converter_script(os.path.join(tmp, "llama.cpp"))
            subprocess.run([sys.executable, script, checkpoint, "--outfile", out, "--outtype", "bf16", "--no-mtp"],
                           check=True, capture_output=True)
        return write

    def random_shape(shape: str):
        return lambda tmp, out: gguf_export.export(
            random_checkpoint.write(shape, os.path.join(tmp, "checkpoint"), layers=layers), out)

    # Every model but SmolLM2 (its real weights) is random weights in a real model's shapes, and
    # can be truncated; a hybrid's depth should be whole periods of its layer pattern (4).
    random_shapes = {"qwen3-0.6b": random_shape, "tinyllama-1.1b": random_shape, "qwen2.5-0.5b": random_shape,
                     "qwen3.5-0.8b": qwen3_5, "qwen3.5-2b": qwen3_5}
    sources = {REAL_WEIGHTS[0]: smollm2, **{n: source(n) for n, source in random_shapes.items()}}
    unknown = [n for n in names if n not in sources] + [t for t in types if t not in FILE_TYPES]
    if unknown:
        raise ValueError(f"unknown model(s) or type(s) {unknown}; models: {sorted(sources)}, "
                         f"types: {', '.join(FILE_TYPES)}")
    if layers is not None and any(n not in random_shapes for n in names):
        raise ValueError(f"only the random-weight models {sorted(random_shapes)} can be truncated to {layers} layers")
    files = {}
    for base in names:
        name = base if layers is None else f"{base}-{layers}l"
        bf16 = os.path.join(work, f"{name}-bf16.gguf")
        if not os.path.exists(bf16):
            logging.info("%s: writing %s", name, bf16)
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                sources[base](tmp, bf16 + ".part")
            os.replace(bf16 + ".part", bf16)
        for kind in types:
            path = bf16 if kind == "bf16" else os.path.join(work, f"{name}-{kind}.gguf")
            if not os.path.exists(path):
                logging.info("%s: quantizing to %s with llama.cpp", name, kind)
                subprocess.run([python, "-P", os.path.join(_HERE, "llama_cpp_peer_guest.py"),
                                f"--quantize-from={bf16}", f"--ftype={kind}", f"--model={path}.part",
                                f"--threads={threads}"], check=True, capture_output=True)
                os.replace(path + ".part", path)
            files[f"{base} {kind}"] = path
    return files


def decode_step_bytes(path: str) -> int:
    """Bytes of a GGUF's weights a decode step reads: every matrix but the token
    embedding (a lookup reads a row per token), which counts when the file has no
    `output.weight` and the output projection reads it instead (tied)."""
    from rvascend.models import gguf_file

    f = gguf_file.GgufFile(path)
    try:
        tied = "output.weight" not in f.tensors
        return sum(t.n_bytes for t in f.tensors.values()
                   if len(t.dims) >= 2 and (tied or t.name != "token_embd.weight"))
    finally:
        f.close()


def with_weight_rate(record: dict[str, Any], step_bytes: int, copy_gbps: float) -> dict[str, Any]:
    """`record` with the weights it streamed a decode step, in GB/s and as a fraction of
    the copy bandwidth."""
    gbps = step_bytes / record["median_decode_latency"] / 1e9
    return {**record, "weight_gbps": gbps, "bandwidth_fraction": gbps / copy_gbps}


def _last_json_line(out: str) -> dict[str, Any]:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def run_llama_cpp(python: str, model: str, batch: int, threads: int) -> dict[str, Any]:
    # -P: the guest must not import this directory's modules in place of installed ones.
    cmd = [python, "-P", os.path.join(_HERE, "llama_cpp_peer_guest.py"), f"--model={model}", f"--batch-size={batch}",
           f"--input-len={FLAGS['input-len'].value}", f"--output-len={FLAGS['output-len'].value}",
           f"--threads={threads}", f"--repeats={FLAGS.repeats}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed: {done.stderr[-2000:]}")
    return _last_json_line(done.stdout)


def run_ours(model: str, batch: int, policy: str, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "one_batch.jsonl")
        cmd = [sys.executable, "-m", "rvascend.bench.one_batch", f"--model-path={model}", f"--batch-size={batch}",
               f"--input-len={FLAGS['input-len'].value}", f"--output-len={FLAGS['output-len'].value}",
               f"--policy={policy}", f"--threads={threads}", f"--repeats={FLAGS.repeats}", f"--output={out}",
               "--plot="]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            record = json.loads(f.readline())
    record.pop("manifest", None)
    return {**record, "ttft": record["prefill_latency"]}


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's record over its rounds: each number the median of the rounds' (peak
    RSS the largest), anything else the last round's, and the count of rounds."""
    merged = dict(rounds[-1])
    for key in merged:
        values = [r.get(key) for r in rounds]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = max(values) if key.startswith("peak_rss") else statistics.median(values)
    merged["rounds"] = len(rounds)
    return merged


def main(argv: list[str]) -> int:
    del argv
    work = FLAGS["work-dir"].value or os.path.join(checkout.root(), ".deps", "llama_cpp")
    os.makedirs(work, exist_ok=True)
    threads = FLAGS.threads or len(os.sched_getaffinity(0))
    # Every process started below inherits the cap.
    os.environ.update(ISA_ENVIRONMENT[FLAGS.isa])
    python = llama_cpp.ensure_python(work, FLAGS.isa)
    models = prepare_models(work, FLAGS.models, FLAGS.types, python, threads)
    keys = ("prefill_throughput", "median_decode_throughput", "ttft", "median_decode_latency", "peak_rss_mib")
    records = []
    for name, path in models.items():
        for batch in (int(b) for b in FLAGS["batch-sizes"].value):
            base = {"model": name, "type": name.split()[-1], "gguf": os.path.basename(path), "batch_size": batch,
                    "threads": threads, "isa": FLAGS.isa, "input_len": FLAGS["input-len"].value,
                    "output_len": FLAGS["output-len"].value}
            runs: dict[str, list[dict[str, Any]]] = {}
            for round_ in range(FLAGS.rounds):
                logging.info("%s bs %d: llama.cpp (round %d of %d)", name, batch, round_ + 1, FLAGS.rounds)
                runs.setdefault("llama.cpp", []).append(run_llama_cpp(python, path, batch, threads))
                for policy in FLAGS.policy:
                    logging.info("%s bs %d: rvascend, policy %s", name, batch, policy)
                    runs.setdefault(policy, []).append(run_ours(path, batch, policy, threads))
            # Every process of this engine probes the copy bandwidth; the group's median serves both.
            probes = [r["copy_gbps"] for rounds in runs.values() for r in rounds if "copy_gbps" in r]
            copy_gbps = statistics.median(probes) if probes else float("nan")
            step_bytes = decode_step_bytes(path)
            base["weight_bytes_per_step"] = step_bytes
            peer = median_of_rounds(runs.pop("llama.cpp"))
            records.append(with_weight_rate({**base, "run_name": "llama.cpp", "backend": "llama.cpp", **peer,
                                             "copy_gbps": copy_gbps}, step_bytes, copy_gbps))
            for policy, rounds in runs.items():
                ours = median_of_rounds(rounds)
                ratios = {f"ratio_{k}": ours[k] / peer[k] for k in keys}
                records.append(with_weight_rate({**base, "run_name": f"rvascend-policy-{policy}",
                                                 "backend": "rvascend", "policy": policy,
                                                 **{k: ours[k] for k in keys}, **ratios, "copy_gbps": copy_gbps},
                                                step_bytes, copy_gbps))
    print_table(records, [("model", "model", "s"), ("batch_size", "bs", "d"), ("run_name", "run", "s"),
                          ("prefill_throughput", "prefill tok/s", ".1f"),
                          ("median_decode_throughput", "decode tok/s", ".2f"), ("ttft", "TTFT s", ".4f"),
                          ("peak_rss_mib", "peak RSS MiB", ".0f"),
                          ("weight_gbps", "weights GB/s", ".1f"), ("bandwidth_fraction", "of copy BW", ".2f"),
                          ("ratio_prefill_throughput", "prefill x", ".2f"),
                          ("ratio_median_decode_throughput", "decode x", ".2f"),
                          ("ratio_ttft", "TTFT x", ".2f"), ("ratio_peak_rss_mib", "RSS x", ".2f")])
    print("x: this engine / llama.cpp, measured in this run (decode x > 1: faster than llama.cpp; "
          "TTFT x and RSS x < 1: better). weights GB/s: the file's matrices a decode step reads, per second; "
          "of copy BW: that over the copy bandwidth measured by this engine's processes in the same run")
    manifest = None
    try:
        from rvascend.repro import manifest as repro

        manifest = repro.capture()
    except ImportError:
        pass
    write_jsonl(FLAGS.output, records, manifest)
    if FLAGS.plot:
        groups = sorted({(r["model"], r["batch_size"]) for r in records}, key=lambda g: (g[0], g[1]))
        runs = sorted({r["run_name"] for r in records})
        value = {(r["model"], r["batch_size"], r["run_name"]): r["median_decode_throughput"] for r in records}
        bar_plot(FLAGS.plot, f"decode tok/s, {threads} threads, {FLAGS['input-len'].value} in / "
                 f"{FLAGS['output-len'].value} out", [f"{m} bs{b}" for m, b in groups],
                 {run: [value.get((m, b, run), 0.0) for m, b in groups] for run in runs}, "tokens / s")
    logging.info("wrote %s", FLAGS.output)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))

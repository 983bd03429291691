"""The benchmark suite (`./dev bench`, `nix run .#bench`): kernels, policy, one batch, serving,
and (asked for by name) riscv64_step, the whole decode step counted on riscv64,
llama_cpp, llama.cpp measured side by side with this engine on the same GGUF files, and
llama_cpp_riscv64, llama.cpp counted on the emulated board.

Each part runs as its own process (fresh memory, fresh compile state) and
appends jsonl records, each carrying the reproducibility manifest, under
--output-dir. Pass --parts to run a subset.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["kernels", "policy", "one_batch", "serving"], "Which benchmarks to run.")
flags.DEFINE_string("output-dir", None, "Directory for jsonl and PNG files (default: bench_results/<time>).")
flags.DEFINE_string("model-path", None,
                    "Checkpoint for one_batch and serving (default: the random-weight test model).")
flags.DEFINE_bool("quick", False, "Smaller shapes and fewer rows: a smoke run of the whole suite.")


def _parts(out: str, model: list[str], quick: bool) -> dict[str, list[str]]:
    return {
        "kernels": ["rvascend.bench.linear_bench", f"--output={out}/kernels.jsonl"]
        + (["--rows=1,16", "--projections=o_proj,gate_up_proj", "--min_seconds=0.05"] if quick else []),
        "policy": ["rvascend.bench.policy_bench", f"--output={out}/policy.jsonl"]
        + (["--layers=1", "--rows=1,2", "--budgets=0,100", "--cpu-compile-mode=eager"] if quick else []),
        "one_batch": ["rvascend.bench.one_batch", f"--output={out}/one_batch.jsonl", f"--plot={out}/one_batch.png",
                      "--hf"] + model + (["--cpu-compile-mode=eager"] if quick else []),
        "serving": ["rvascend.bench.serving", f"--output={out}/serving.jsonl", f"--plot={out}/serving.png"]
        + model + (["--server-args=--cpu-compile-mode=eager", "--num-prompts=2"] if quick else []),
        # Not in the default set: ITL of running requests while a long prompt is prefilled, by chunk size.
        "chunked_prefill": ["rvascend.bench.chunked_prefill", f"--output={out}/chunked_prefill.jsonl"] + model
        + (["--sizes=-1,64", "--long-input-len=1024"] if quick else []),
        # Not in the default set: TTFT with a shared 1k-token system prompt, prefix cache on vs off.
        "prefix_cache": ["rvascend.bench.prefix_cache", f"--output={out}/prefix_cache.jsonl"] + model
        + (["--system-len=256", "--requests-per-client=2"] if quick else []),
        # Not in the default set: a multi-turn chat on Qwen3.5's shapes, prefix cache on vs off, and a restart
        # served from the hierarchical cache's files.
        "multi_turn": ["rvascend.bench.multi_turn", f"--output={out}/multi_turn.jsonl"] + model
        + (["--shape=test", "--turns=2", "--system-len=256"] if quick else []),
        # Not in the default set: time per output token at token 512 vs 16, batch 1.
        "long_output": ["rvascend.bench.long_output", f"--output={out}/long_output.jsonl"] + model
        + (["--at=16,128"] if quick else []),
        # Not in the default set: start-up with the compile cache cold and warm, graphs, staleness check cost.
        "policy_overheads": ["rvascend.bench.policy_overheads", f"--output={out}/policy_overheads.jsonl"]
        + (["--shape=test", "--max-concurrency=2"] if quick else []),
        # Not in the default set: builds llama.cpp from source once (about 5 minutes), then about 10.
        "llama_cpp": ["rvascend.bench.llama_cpp_peer", f"--output={out}/llama_cpp.jsonl", f"--plot={out}/llama_cpp.png"]
        + (["--models=smollm2-135m", "--batch-sizes=1", "--output-len=16"] if quick else []),
        # Not in the default set: quantized Linear vs ggml's RVV kernels, counted under QEMU (minutes).
        "quantized_peers": ["rvascend.bench.quantized_peers", f"--output={out}/quantized_peers.jsonl"]
        + (["--vlens=256", "--n=512", "--k=512"] if quick else []),
        # Not in the default set: 1, 2 and 4 servers behind sglang-router (about 5 minutes).
        "scale_out": ["rvascend.bench.scale_out", f"--output={out}/scale_out.jsonl"]
        + (["--workers=1,2", "--num-prompts=8", "--latency-pairs=10", "--shape=test"] if quick else []),
        # Not in the default set: n-gram speculative decoding on and off, a copying task and free text.
        "speculative": ["rvascend.bench.speculative", f"--output={out}/speculative.jsonl"] + model
        + (["--output-len=16", "--rounds=1", "--batch=2"] if quick else []),
        # Not in the default set: the same with SUFFIX drafts (recent requests' text), a summary asked twice.
        "speculative_suffix": ["rvascend.bench.speculative", f"--output={out}/speculative.jsonl",
                               "--algorithm=SUFFIX"] + model
        + (["--output-len=16", "--rounds=1", "--batch=2"] if quick else []),
        # Not in the default set: a draft model (the default model's own Q4_0) against its BF16 target.
        "speculative_standalone": ["rvascend.bench.speculative", f"--output={out}/speculative.jsonl",
                                   "--algorithm=STANDALONE"] + model
        + (["--output-len=16", "--rounds=1", "--batch=2"] if quick else []),
        # Not in the default set: deterministic inference against the kernels' default gate and ATen.
        "deterministic": ["rvascend.bench.deterministic", f"--output={out}/deterministic.jsonl"] + model
        + (["--steps=4", "--rounds=1", "--prefill-len=64"] if quick else []),
        # Not in the default set: the same for an FP32 model (the FP32 Linear and attention kernels).
        "deterministic_fp32": ["rvascend.bench.deterministic", f"--output={out}/deterministic.jsonl",
                               "--dtype=float32"] + model
        + (["--steps=4", "--rounds=1", "--prefill-len=64"] if quick else []),
        # Not in the default set: a decode step with and without a grammar (llguidance's masks).
        "structured_output": ["rvascend.bench.structured_output", f"--output={out}/structured_output.jsonl"] + model
        + (["--steps=8", "--rounds=1", "--batch=2"] if quick else []),
        # Not in the default set: 16 clients, valid and hostile requests mixed, for --seconds (default 60).
        "soak": ["rvascend.bench.soak", f"--output={out}/soak.jsonl"] + model + (["--seconds=20"] if quick else []),
        # Not in the default set: the Responses and Messages layers' cost per request and per token.
        "api_overhead": ["rvascend.bench.api_overhead", f"--output={out}/api_overhead.jsonl"]
        + (["--rounds=200", "--tokens=200"] if quick else []),
        # Not in the default set: the Codex CLI and Claude Code, installed with npm, two turns each.
        "agents": ["rvascend.bench.agents", f"--output={out}/agents.jsonl"] + model
        + (["--turns=1"] if quick else []),
        # Not in the default set: llama.cpp's riscv64 build counted under QEMU on the files of llama.cpp's
        # public BPI-F3 tables (about an hour of emulation; bench/calibration fits the board model to them).
        "llama_cpp_riscv64": ["rvascend.bench.llama_cpp_riscv64", f"--output={out}/llama_cpp_riscv64.jsonl"]
        + (["--types=q4_0", "--variants=repack", "--prompts=16,64"] if quick else []),
        # Not in the default set: about 30 minutes of emulation.
        "riscv64_step": ["rvascend.bench.riscv64_step", f"--output={out}/riscv64_step.jsonl",
                         f"--plot={out}/riscv64_step.png"]
        + (["--contexts=64", "--rows=1", "--modes=stock,full"] if quick else []),
    }


def main(argv: list[str]) -> int:
    del argv
    out = FLAGS["output-dir"].value or os.path.join(
        "bench_results", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    model = [f"--model-path={FLAGS['model-path'].value}"] if FLAGS["model-path"].value else []
    parts = _parts(out, model, FLAGS.quick)
    unknown = [p for p in FLAGS.parts if p not in parts]
    if unknown:
        logging.error("unknown part(s) %s; known: %s", unknown, ", ".join(parts))
        return 2
    failed = []
    for i, name in enumerate(FLAGS.parts, 1):
        logging.info("[%d/%d] %s", i, len(FLAGS.parts), name)
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", *parts[name]]).returncode
        logging.info("[%d/%d] %s: %s in %.0f s", i, len(FLAGS.parts), name, "ok" if rc == 0 else f"exit {rc}",
                     time.monotonic() - t0)
        if rc != 0:
            failed.append(name)
    logging.info("results in %s", out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(app.run(main))

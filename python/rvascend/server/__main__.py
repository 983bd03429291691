"""`serve`: an OpenAI-compatible server (flags follow SGLang's names).

  bazel run //python:serve -- [--model-path DIR|FILE.gguf] [--enable-cpu-rvv-kernels] [--port 30000]

Without --model-path it serves SmolLM2-135M-Instruct (models/default_model.py), converted
from its pinned GGUF into the cache at first use.
"""

from __future__ import annotations

import sys

import uvicorn
from absl import app, flags, logging

from rvascend.server import limits
from rvascend.server.app import create_app
from rvascend.server.limits import API_KEY_ENV
from rvascend.server.launch import ServeOptions, build_engine

flags.DEFINE_string("model-path", None,
                    "Hugging Face checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct).")
flags.DEFINE_string("served-model-name", None, "Model name reported by the API.")
flags.DEFINE_string("device", "cpu", "Device (cpu).")
flags.DEFINE_string("dtype", "bfloat16", "Weights and activations: bfloat16 or float32.")
flags.DEFINE_string("attention-backend", "torch_native", "Attention backend (torch_native: SDPA per request).")
flags.DEFINE_bool("enable-cpu-rvv-kernels", False,
                  "The project's kernels (RVV, or AVX2 / AVX-512 on x86) for Linears, quantized weights kept "
                  "quantized, attention and elementwise ops, and on a decode step the whole model in one native "
                  "call (the fused step); routed projections compiled regionally, small batches bucketed.")
# SGLang's name for the CPU kernels switch, which users of this project already type.
flags.DEFINE_alias("enable-cpu-rvv-inductor", "enable-cpu-rvv-kernels")
flags.DEFINE_integer("cpu-rvv-memory-budget-mib", None, "Memory budget for packed weights (default: derived).")
flags.DEFINE_enum("cpu-compile-mode", None, ["regional", "eager"],
                  "How routed projections run: regional (Inductor compiles the repeated block) or eager; default: "
                  "regional, eager under deterministic inference.")
flags.DEFINE_enum("cpu-rvv-shape-gate", None, ["bucketed", "measured", "invariant", "seed"],
                  "Which Linears the policy packs: bucketed, the seed's contract (BF16, N and K >= 1024, rows "
                  "padded to buckets; 'seed' is its earlier name), or measured, where the packed kernel measured "
                  "faster than ATen here: instruction counts on riscv64, timed once on other hosts (default), or "
                  "invariant, every BF16 Linear at every row count (--enable-deterministic-inference).")
flags.DEFINE_bool("cpu-rvv-drop-unpacked", False,
                  "Free each packed projection's row-major weight: the packed copy is the weight (a tied lm_head "
                  "keeps both; state_dict() unpacks).")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind.")
flags.DEFINE_integer("port", 30000, "Port to bind.")
flags.DEFINE_string("api-key", None, "Require `Authorization: Bearer KEY` on every endpoint but /health and "
                    f"/metrics. {API_KEY_ENV} in the environment does the same and keeps the key off the "
                    "process list.")
flags.DEFINE_list("allowed-hosts", [], "Host header names served besides the loopback names and --host (a web "
                  "page that rebinds its DNS name to this machine is refused); '*': any. Bound to 0.0.0.0, any "
                  "host is served unless this lists them.")
flags.DEFINE_integer("max-running-requests", 8, "Sequences decoding together at most.")
flags.DEFINE_integer("max-total-tokens", None, "KV pool size in tokens (default: from free memory).")
flags.DEFINE_integer("max-queued-requests", 64, "Requests queued or running before 503s.")
flags.DEFINE_integer("context-length", None, "Context length (default: the model's).")
flags.DEFINE_integer("chunked-prefill-size", None,
                     "Prompt tokens per prefill step; a longer prompt is prefilled over several steps, "
                     "alternating with the running requests' decode steps (-1: whole prompts in one step; "
                     "default: 512, on riscv64 64, measured for the K1).")
flags.DEFINE_bool("disable-radix-cache", False,
                  "No prefix cache: every prompt is prefilled whole, even when an earlier request ran its prefix.")
flags.DEFINE_enum("tool-call-parser", None, ["qwen25", "llama3"],
                  "Tool calls' output format: qwen25 (Hermes <tool_call> blocks: Qwen2.5, Qwen3, Qwen3.5, SmolLM2) "
                  "or llama3 (a JSON object); default: the model family's.")
flags.DEFINE_enum("reasoning-parser", None, ["qwen3"],
                  "Split <think>...</think> into reasoning_content (qwen3: Qwen3 and Qwen3.5); default: off.")
flags.DEFINE_bool("enable-deterministic-inference", None,
                  "Same request, same answer: a request's logits do not depend on what it is batched with, the "
                  "prefix cache or the prefill chunking (BF16 and FP32; installs the kernels' policy with the "
                  "invariant shape gate). Default: on where it costs nothing (RVV in BF16; x86 with AVX2 or "
                  "AVX-512), off elsewhere; --noenable-deterministic-inference turns it off.")
flags.DEFINE_enum("speculative-algorithm", None, ["NGRAM", "NEXTN"],
                  "Speculative decoding: NGRAM drafts tokens from the request's own prompt and output, NEXTN with "
                  "a Qwen3.5 checkpoint's MTP head; one step verifies them (the output is exactly what decoding "
                  "without drafts gives); default: off.")
flags.DEFINE_integer("speculative-num-draft-tokens", 4, "Draft tokens per sequence and step, at most.")
flags.DEFINE_string("speculative-token-map", None,
                    "NEXTN: a file of token ids (JSON list or whitespace-separated), e.g. the most frequent ones; "
                    "the MTP head drafts among them only (the verify step keeps the full vocabulary, so the output "
                    "does not change).")
flags.DEFINE_integer("speculative-ngram-min-match-window-size", 2, "Shortest n-gram an NGRAM draft matches.")
flags.DEFINE_integer("speculative-ngram-max-match-window-size", 8, "Longest n-gram an NGRAM draft matches.")
flags.DEFINE_float("watchdog-timeout", 300.0, "/health reports unhealthy when one engine step runs longer (s).")
flags.DEFINE_float("graceful-shutdown-timeout", 5.0,
                   "On SIGTERM/SIGINT, seconds open requests get before the server exits anyway.")

FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    del argv
    opts = ServeOptions(
        model_path=FLAGS["model-path"].value, dtype=FLAGS["dtype"].value, device=FLAGS["device"].value,
        attention_backend=FLAGS["attention-backend"].value,
        enable_cpu_rvv_kernels=FLAGS["enable-cpu-rvv-kernels"].value,
        cpu_rvv_memory_budget_mib=FLAGS["cpu-rvv-memory-budget-mib"].value,
        cpu_compile_mode=FLAGS["cpu-compile-mode"].value,
        cpu_rvv_shape_gate=FLAGS["cpu-rvv-shape-gate"].value,
        cpu_rvv_drop_unpacked=FLAGS["cpu-rvv-drop-unpacked"].value,
        max_running_requests=FLAGS["max-running-requests"].value,
        max_total_tokens=FLAGS["max-total-tokens"].value,
        max_queued_requests=FLAGS["max-queued-requests"].value,
        context_length=FLAGS["context-length"].value,
        chunked_prefill_size=FLAGS["chunked-prefill-size"].value,
        disable_radix_cache=FLAGS["disable-radix-cache"].value,
        enable_deterministic_inference=FLAGS["enable-deterministic-inference"].value,
        speculative_algorithm=FLAGS["speculative-algorithm"].value,
        speculative_num_draft_tokens=FLAGS["speculative-num-draft-tokens"].value,
        speculative_token_map=FLAGS["speculative-token-map"].value,
        speculative_ngram_min_match_window_size=FLAGS["speculative-ngram-min-match-window-size"].value,
        speculative_ngram_max_match_window_size=FLAGS["speculative-ngram-max-match-window-size"].value)
    try:
        engine, name, policy = build_engine(opts)
    except (ValueError, FileNotFoundError) as e:
        logging.error("%s", e)
        return 2
    name = FLAGS["served-model-name"].value or name
    logging.info("serving %s on http://%s:%d", name, FLAGS.host, FLAGS.port)
    server_args = {"model_path": opts.model_path, "served_model_name": name, "dtype": opts.dtype,
                   "device": opts.device, "attention_backend": opts.attention_backend,
                   "enable_cpu_rvv_kernels": policy is not None,
                   "enable_deterministic_inference": policy is not None and policy.config.deterministic,
                   "max_running_requests": opts.max_running_requests,
                   "max_total_tokens": engine.config.max_total_tokens}
    app_ = create_app(engine, name, policy, limits.resolve_api_key(FLAGS["api-key"].value),
                      FLAGS["watchdog-timeout"].value, server_args,
                      limits.allowed_hosts(FLAGS.host, FLAGS["allowed-hosts"].value),
                      tool_call_parser=FLAGS["tool-call-parser"].value, reasoning_parser=FLAGS["reasoning-parser"].value)
    uvicorn.run(app_, host=FLAGS.host, port=FLAGS.port, log_level="warning",
                timeout_graceful_shutdown=FLAGS["graceful-shutdown-timeout"].value)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))

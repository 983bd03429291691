"""Builds a ready engine from serving options: model, tokenizer, KV pool, RVV policy."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Optional

import psutil
import torch
from absl import logging

from rvascend.engine import Engine, SamplingParams
from rvascend.runtime import allocator
from rvascend.models import default_model
from rvascend.tokenizer.chat_template import ChatTemplateError
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models.decoder import KVPool
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicy, KernelPolicyConfig, get_policy, install_kernel_policy
from rvascend.dispatch import fused_decoder, shape_gate
from rvascend.server import server_args
from rvascend.server.server_args import ServerArgs

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# Without --max-total-tokens the KV pool gets at most this share of free memory.
_KV_MEMORY_FRACTION = 0.25
_KV_MAX_DEFAULT_TOKENS = 32768
# The hierarchical cache's host tier may take at most this share of what is free beside them.
_HICACHE_MEMORY_FRACTION = 0.5


def default_chunked_prefill_size() -> int:
    """Prompt tokens per prefill step unless --chunked-prefill-size says otherwise.

    On riscv64, 64, from bench/riscv64_step.py's prefill counts projected onto the
    K1 (8 threads): a 64-token chunk runs at 90 % of a 256-token chunk's rate for
    SmolLM2-135M (357 vs 395 prompt tok/s; 16 tokens: 246) and at 1.3x a 16-token
    chunk's for Qwen3-0.6B (100.6 vs 76.3), and one chunk's step keeps the running
    requests waiting for 0.18 s (SmolLM2) or 0.64 s (Qwen3-0.6B) instead of four
    times that. Elsewhere, 512."""
    return 64 if platform.machine() == "riscv64" else 512


def uvicorn_options(opts: ServerArgs) -> dict:
    """What uvicorn runs with, for `serve` and the tests' server alike."""
    if not opts.timeout_keep_alive > 0:
        raise ValueError(f"--timeout-keep-alive {opts.timeout_keep_alive}: give a positive number of seconds")
    return dict(log_level="warning", timeout_keep_alive=opts.timeout_keep_alive,
                timeout_graceful_shutdown=opts.graceful_shutdown_timeout)


def deterministic_by_default(dtype: str, cpu_features: str, kernel_sets: list[str]) -> tuple[bool, str]:
    """Whether deterministic inference is on when the command line does not say, and why:
    where its kernels cost nothing against the stock path. Measured by `./dev bench
    --parts=deterministic` and `deterministic_fp32` (docs/serving.md) on the default model,
    each x86 class on one AVX-512 BF16 host with every library capped to it (RVASCEND_MAX_ISA,
    ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), step time against the
    stock path's: AVX-512 BF16 + VNNI 0.38x-0.72x (BF16) and 0.54x-0.66x (FP32); AVX-512
    without BF16 and VNNI 0.27x-0.52x and 0.51x-0.66x; AVX2 0.23x-0.73x and 0.61x-0.96x. On
    an Intel Xeon with AMX-BF16 (one thread, the random test model) the stock path's BF16
    prefill runs on oneDNN's AMX tiles: 256 tokens in 0.049 s against the invariant kernels'
    0.232 s (4.7x), so BF16 there stays off; AMX has no FP32 tiles, so FP32 keeps its AVX-512
    figures. On RVV the BF16 stock path is scalar ATen; FP32 on riscv64 is not measured."""
    if dtype not in ("bfloat16", "float32"):
        return False, f"--dtype {dtype} has no batch-invariant kernels"
    if dtype == "bfloat16" and "amxbf16=1" in cpu_features:
        return False, ("AMX-BF16: the stock path's BF16 prefill runs on oneDNN's AMX tiles, 4.7x the invariant "
                       "kernels' speed at 256 tokens (--enable-deterministic-inference turns them on anyway)")
    if "rvv" in kernel_sets:
        if dtype == "float32":
            return False, ("FP32 on riscv64: its invariant kernels' cost is not measured there "
                           "(--enable-deterministic-inference turns them on anyway)")
        return True, "RVV: the kernels' invariant gate is their default, and the stock path is scalar ATen"
    if "avx2=1" in cpu_features:
        return True, ("x86 with AVX2 or AVX-512: the invariant kernels are faster than the stock path at every "
                      "step measured (decode and prefill, batch 1 and 8)")
    return False, ("no AVX2: the invariant kernels' cost is not measured on this CPU "
                   "(--enable-deterministic-inference turns them on anyway)")


def _log_cpu() -> None:
    """What the kernels will run on: the CPU as detected, and the kernel set each family picked."""
    from rvascend import ops
    from rvascend.ops import kernel_sets

    logging.info("CPU: %s", ops.cpu_features())
    logging.info("kernel sets (best first; the first runs): %s", kernel_sets.describe())
    if "rvv" not in ops.available_kernel_sets() and "riscv" in ops.cpu_features():
        logging.warning("this riscv64 CPU reports no RVV 1.0 (V): every kernel runs its scalar/portable "
                        "path, and F.linear serves where the policy would pack")


def build_engine(opts: ServerArgs) -> tuple[Engine, str, Optional[KernelPolicy]]:
    """(engine, served model name, installed policy or None)."""
    if opts.device != "cpu":
        raise ValueError(f"--device {opts.device!r} is not supported: this engine serves on the CPU")
    if opts.attention_backend != "torch_native":
        raise ValueError(f"--attention-backend {opts.attention_backend!r} is not supported (torch_native only)")
    if opts.cpu_kernels_drop_unpacked and not opts.enable_cpu_kernels:
        raise ValueError("--cpu-kernels-drop-unpacked frees the weights the policy's packed copies replace: it needs "
                         "--enable-cpu-kernels")
    if opts.dtype not in _DTYPES:
        raise ValueError(f"--dtype {opts.dtype!r} is not supported ({', '.join(_DTYPES)})")
    _check_draft_flags(opts)  # before any weight is read
    if opts.enable_deterministic_inference is None:
        from rvascend import ops

        on, why = deterministic_by_default(opts.dtype, ops.cpu_features(), ops.available_kernel_sets())
        conflict = KernelPolicyConfig(shape_gate=opts.cpu_kernels_shape_gate,
                                   compile_mode=opts.cpu_compile_mode).determinism_conflict()
        if on and conflict:
            on, why = False, conflict
        logging.info("deterministic inference %s by default: %s", "on" if on else "off", why)
        opts = dataclasses.replace(opts, enable_deterministic_inference=on)
    # Deterministic inference installs the policy: its kernels give a row the same result in any batch.
    kernels = opts.enable_cpu_kernels or opts.enable_deterministic_inference
    _log_cpu()
    allocator.pin_mmap_threshold()  # before any weight is allocated
    path = opts.model_path or default_model.ensure_default_model()
    name = os.path.basename(opts.model_path.rstrip("/")).removesuffix(".gguf") if opts.model_path \
        else default_model.served_name()
    logging.info("model: %s (%s)", name, path)
    # With the RVV policy, a GGUF file's quantized projections stay quantized (every format
    # of ops/quantized_linear.FORMATS); without it the stock path serves them dequantized.
    model = load_model(path, _DTYPES[opts.dtype], keep_quantized=opts.enable_cpu_kernels,
                       mtp=opts.speculative_algorithm == "NEXTN")
    if opts.speculative_token_map:
        if opts.speculative_algorithm != "NEXTN":
            raise ValueError("--speculative-token-map restricts NEXTN's drafts: it needs --speculative-algorithm NEXTN")
        from rvascend.models import qwen3_5_mtp

        qwen3_5_mtp.restrict_draft_vocab(model, qwen3_5_mtp.read_token_map(opts.speculative_token_map))
    tokenizer = Tokenizer(path)
    draft = _draft_model(opts, tokenizer, model)
    if tokenizer.chat_template is not None:
        try:
            tokenizer.chat_template.probe()
        except ChatTemplateError as e:
            raise ValueError(f"{name}'s chat template cannot serve a chat: {e}") from None
    policy = _install_kernels(opts, name, model, draft) if kernels else None
    tokens = opts.max_total_tokens
    # A draft model's pool has as many slots as the target's.
    per_token = sum(KVPool.bytes_per_token(m.config, _DTYPES[opts.dtype]) for m in (model, draft) if m is not None)
    if tokens is None:
        tokens = int(min(_KV_MAX_DEFAULT_TOKENS, psutil.virtual_memory().available * _KV_MEMORY_FRACTION // per_token))
        logging.info("KV pool: %d tokens (%.1f MiB%s)", tokens, tokens * per_token / 2**20,
                     ", the draft model's pool included" if draft is not None else "")
    if opts.enable_hierarchical_cache:
        _check_host_tier(opts.hicache_size, tokens * per_token)
    chunk = default_chunked_prefill_size() if opts.chunked_prefill_size is None else opts.chunked_prefill_size
    logging.info("chunked prefill: %s", f"{chunk} prompt tokens per step" if chunk > 0 else "whole prompts")
    engine = Engine(model, tokenizer, server_args.engine_config(opts, max_total_tokens=tokens,
                                                                 chunked_prefill_size=chunk), draft_model=draft)
    allocator.keep_step_buffers()  # the weights are in place
    if policy is not None and policy.regional is not None:
        _compile_before_serving(engine, policy)
    return engine, name, policy


def _install_kernels(opts: ServerArgs, name: str, model, draft) -> KernelPolicy:
    """The kernels' policy, installed on the model (and a STANDALONE draft model) as the flags
    ask; the log says what it packed and, under deterministic inference, what it could not."""
    # Without a C++ compiler for Inductor (a board, the riscv64 image) the
    # policy itself falls back to eager routes, logged and counted. Deterministic
    # inference runs eagerly (KernelPolicyConfig.compiles_regionally).
    deterministic = opts.enable_deterministic_inference
    # Under deterministic inference every packed projection runs its packed copy at every
    # row count, so the row-major weight beside it would only double the weights' memory
    # (and shrink the KV pool sized after them): the packed copy becomes the weight.
    config = KernelPolicyConfig.from_flag(memory_budget_mib=opts.cpu_kernels_memory_budget_mib,
                                       compile_mode=opts.cpu_compile_mode,
                                       shape_gate=opts.cpu_kernels_shape_gate,
                                       drop_unpacked=opts.cpu_kernels_drop_unpacked or deterministic,
                                       deterministic=deterministic)
    if deterministic:
        logging.info("deterministic inference: every projection on an invariant kernel at every row count "
                     "(%s), attention on the kernel at every length, eager routes",
                     "the FP32 Linear" if opts.dtype == "float32" else "packed, the invariant shape gate")
    report = install_kernel_policy(model, config)
    policy = get_policy(model)
    if draft is not None:
        install_kernel_policy(draft, config)
    if config.drop_unpacked:
        logging.info("weights: the packed copies (%.1f MiB) replace the row-major weights, which were freed",
                     report.packed_bytes / 2**20)
    row_major = [p for p in report.not_packed if p[2] != "fp32_kernel"]
    if deterministic and row_major:
        logging.warning("deterministic inference: %d projection(s) left unpacked (%s) run F.linear, whose sums "
                        "depend on the row count: their rows are not batch-invariant (a larger "
                        "--cpu-kernels-memory-budget-mib packs them)", len(row_major),
                        ", ".join(sorted({reason for _, _, reason in row_major})))
    if row_major and not report.packed and not any(getattr(r, "quantized", False) for r in policy.routes.values()):
        reasons = sorted({reason for _, _, reason in row_major})
        logging.warning(
            "the RVV policy packed none of %s's Linears (%s; the %s shape gate: %s): they run through F.linear; "
            "the attention and elementwise kernels still apply. /metrics' rvascend_projection_calls_total "
            "shows the route of every call", name, ", ".join(reasons), policy.shape_gate,
            "N, K >= %d, BF16" % shape_gate.MIN_FEATURES if policy.shape_gate == "bucketed"
            else "where the packed kernel measured cheaper")
    return policy


def _check_draft_flags(opts: ServerArgs) -> None:
    path, quantization = opts.speculative_draft_model_path, opts.speculative_draft_model_quantization
    if (opts.speculative_algorithm == "STANDALONE") != bool(path or quantization):
        raise ValueError("--speculative-algorithm STANDALONE drafts with --speculative-draft-model-path or "
                         "--speculative-draft-model-quantization, and only it does: give the algorithm with one")
    if path and quantization:
        raise ValueError("--speculative-draft-model-path and --speculative-draft-model-quantization name two "
                         "draft models: give one")


def _draft_model(opts: ServerArgs, tokenizer: Tokenizer, model):
    """STANDALONE's draft model (None for the other algorithms): a file loaded as the target
    is (a GGUF's quantized matrices kept with the kernels on; its tokenizer must be the
    target's), or the target's own weights quantized in memory."""
    path, quantization = opts.speculative_draft_model_path, opts.speculative_draft_model_quantization
    if quantization:
        from rvascend.models.quantized_copy import quantized_copy
        from rvascend.models.quantized_layers import quantized_modules

        draft = quantized_copy(model, quantization)
        own = sum(m.packed_bytes for _, m in quantized_modules(draft))
        logging.info("draft model: the target's weights in %s (%.1f MiB of quantized matrices; the norms shared)",
                     quantization, own / 2**20)
        return draft
    if not path:
        return None
    from rvascend.engine.standalone_draft import check_tokenizers

    check_tokenizers(tokenizer, Tokenizer(path), path)
    logging.info("draft model: %s", path)
    return load_model(path, _DTYPES[opts.dtype], keep_quantized=opts.enable_cpu_kernels)


def _check_host_tier(gib: float, pool_bytes: int) -> None:
    """The host tier fills as pages are cached: it must fit in what is free beside the
    weights (loaded by now) and the KV pool (`pool_bytes`, allocated next)."""
    free = psutil.virtual_memory().available - pool_bytes
    if gib * 2**30 > free * _HICACHE_MEMORY_FRACTION:
        raise ValueError(f"--hicache-size {gib} GiB is more than {_HICACHE_MEMORY_FRACTION:.0%} of the "
                         f"{max(free, 0) / 2**30:.1f} GiB free beside the weights and the KV pool; give less")


def _compile_before_serving(engine: Engine, policy: KernelPolicy) -> None:
    """One short request before the port opens, so the first client does not wait
    for regional compile (seconds with a warm compile cache, more when cold). It runs
    op by op: the fused step, which most steps take, compiles nothing, and a step it
    leaves to the layers (more rows than it takes) would otherwise compile then."""
    start = time.monotonic()
    logging.info("regional compile: compiling the decoder layer before serving")
    vocab = engine.model.config.vocab_size
    with fused_decoder.held_off(engine.model):
        engine.generate([[i % vocab for i in range(16)]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    engine.flush_cache(tiers=False)  # the warm-up's own K/V; the tiers' files are other runs' work
    policy.counters.reset()
    policy.kernels.counters.reset()
    logging.info("regional compile: %d graphs in %.1f s", len(policy.regional.graphs), time.monotonic() - start)

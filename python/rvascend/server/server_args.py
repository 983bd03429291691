"""Every flag of `serve`, defined once (SGLang's server_args.py is the model).

A field of ServerArgs is a flag: its name with dashes, its type from the annotation,
its default, its help and, for some, its choices. The absl flags (`define_flags`), the
arguments the server runs with (`from_flags`), the engine's config (`engine_config`)
and the flag table of docs/serving.md (`flag_table`; server_args_test fails when the two
differ) all come from here. Where the engine owns a default (EngineConfig), the field
takes it from there, so no default is written twice.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional

from absl import flags

from rvascend.engine import EngineConfig
from rvascend.server.limits import API_KEY_ENV

# SGLang's name for the kernels switch, and the names the kernels' flags had when they
# were RVV's only (they run AVX2 / AVX-512 kernels on x86 as well): old command lines run.
ALIASES = {"enable-cpu-rvv-inductor": "enable-cpu-kernels", "enable-cpu-rvv-kernels": "enable-cpu-kernels",
           "cpu-rvv-memory-budget-mib": "cpu-kernels-memory-budget-mib", "cpu-rvv-shape-gate": "cpu-kernels-shape-gate",
           "cpu-rvv-drop-unpacked": "cpu-kernels-drop-unpacked"}
_ENGINE = EngineConfig()


def _arg(default: Any, help_text: str, choices: Optional[tuple[str, ...]] = None) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text, "choices": choices})


def _list(help_text: str) -> Any:
    return dataclasses.field(default_factory=list, metadata={"help": help_text, "choices": None})


@dataclasses.dataclass
class ServerArgs:
    model_path: Optional[str] = _arg(
        None, "Hugging Face checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct).")
    served_model_name: Optional[str] = _arg(None, "Model name reported by the API.")
    device: str = _arg("cpu", "Device (cpu).")
    dtype: str = _arg("bfloat16", "Weights and activations: bfloat16 or float32.")
    attention_backend: str = _arg("torch_native", "Attention backend (torch_native).")
    enable_cpu_kernels: bool = _arg(
        False, "The project's kernels (RVV, or AVX2 / AVX-512 on x86) for Linears, quantized weights kept "
        "quantized, attention and elementwise ops, and on a decode step the whole model in one native call (the "
        "fused step); routed projections compiled regionally, small batches bucketed. "
        "--enable-cpu-rvv-inductor (SGLang's name) and --enable-cpu-rvv-kernels are the same flag.")
    cpu_kernels_memory_budget_mib: Optional[int] = _arg(None, "Memory budget for packed weights in MiB "
                                                          "(default: derived from free memory).")
    cpu_compile_mode: Optional[str] = _arg(
        None, "How routed projections run: regional (Inductor compiles the repeated block) or eager; default: "
        "regional, eager under deterministic inference.", ("regional", "eager"))
    cpu_kernels_shape_gate: Optional[str] = _arg(
        None, "Which Linears the policy packs: bucketed, the seed's contract (BF16, N and K >= 1024, rows padded "
        "to buckets; 'seed' is its earlier name), measured, where the packed kernel measured faster than ATen "
        "(default), or invariant, every BF16 Linear at every row count (deterministic inference).",
        ("bucketed", "measured", "invariant", "seed"))
    cpu_kernels_drop_unpacked: bool = _arg(
        False, "Free each packed projection's row-major weight: the packed copy is the weight (a tied lm_head "
        "keeps both; state_dict() unpacks). Deterministic inference always does.")
    host: str = _arg("127.0.0.1", "Address to bind.")
    port: int = _arg(30000, "Port to bind.")
    api_key: Optional[str] = _arg(
        None, f"Require `Authorization: Bearer KEY` on every endpoint but /health and /metrics. {API_KEY_ENV} in "
        "the environment does the same and keeps the key off the process list.")
    allowed_hosts: list = _list(
        "Host header names served besides the loopback names and --host (a web page that rebinds its DNS name "
        "to this machine is refused); '*': any. Bound to 0.0.0.0, any host is served unless this lists them.")
    max_running_requests: int = _arg(_ENGINE.max_running_requests, "Sequences decoding together at most.")
    max_total_tokens: Optional[int] = _arg(None, "KV pool size in tokens (default: from free memory).")
    max_queued_requests: int = _arg(_ENGINE.max_queued_requests, "Requests queued or running before 503s.")
    context_length: Optional[int] = _arg(None, "Context length (default: the model's).")
    chunked_prefill_size: Optional[int] = _arg(
        None, "Prompt tokens per prefill step; a longer prompt is prefilled over several steps, alternating with "
        "the running requests' decode steps (-1: whole prompts in one step; default: 512, on riscv64 64, "
        "measured for the K1).")
    disable_radix_cache: bool = _arg(
        _ENGINE.disable_radix_cache, "No prefix cache: every prompt is prefilled whole, even when an earlier "
        "request ran its prefix.")
    max_mamba_cache_size: int = _arg(
        _ENGINE.max_mamba_cache_size, "Hybrid models (Qwen3.5): recurrent-state snapshots the prefix cache keeps "
        "at most, least recently used evicted first (each the size of one sequence's states, logged at start: "
        "18.6 MiB for Qwen3.5-0.8B in BF16); a request resumes after the deepest cached snapshot of its prompt.")
    mamba_track_interval: int = _arg(
        _ENGINE.mamba_track_interval, "Hybrid models: prompt tokens between two recurrent-state snapshots of one "
        "prefill (snapshots are also taken at each prompt's end and each request's end).")
    enable_hierarchical_cache: bool = _arg(
        _ENGINE.enable_hierarchical_cache, "Keep the prefix cache's K/V pages (and a hybrid model's recurrent-state "
        "snapshots) beyond the KV pool, in host memory and with a storage backend in files that outlive the "
        "process; a prompt whose prefix is there loads it instead of prefilling it.")
    hicache_size: float = _arg(_ENGINE.hicache_size, "Host-memory tier of the hierarchical cache, in GiB.")
    hicache_storage_backend: Optional[str] = _arg(
        _ENGINE.hicache_storage_backend, "The hierarchical cache's storage tier: file (a private directory, "
        "--hicache-storage-dir); default: none.", ("file",))
    hicache_storage_dir: Optional[str] = _arg(
        _ENGINE.hicache_storage_dir, "Directory of the file storage tier (created mode 0700); default: "
        "~/.cache/rvascend/hicache.")
    hicache_storage_size: float = _arg(_ENGINE.hicache_storage_size, "File storage tier's size, in GiB.")
    tool_call_parser: Optional[str] = _arg(
        None, "Tool calls' output format: qwen25 (Hermes `<tool_call>` blocks: Qwen2.5, Qwen3, Qwen3.5, SmolLM2) or "
        "llama3 (a JSON object); default: the model family's.", ("qwen25", "llama3"))
    reasoning_parser: Optional[str] = _arg(
        None, "Split `<think>...</think>` into reasoning_content (qwen3: Qwen3 and Qwen3.5); default: off.",
        ("qwen3",))
    enable_deterministic_inference: Optional[bool] = _arg(
        None, "Same request, same answer: a request's logits do not depend on what it is batched with, the "
        "prefix cache or the prefill chunking (BF16 and FP32; installs the kernels' policy with the invariant "
        "shape gate). Default: on where it costs nothing (RVV in BF16; x86 with AVX2 or AVX-512, except BF16 on "
        "hosts with AMX), off elsewhere; --noenable-deterministic-inference turns it off.")
    speculative_algorithm: Optional[str] = _arg(
        _ENGINE.speculative_algorithm, "Speculative decoding: NGRAM drafts tokens from the request's own prompt "
        "and output, SUFFIX from those or from recent requests of the same API key (the longer match), NEXTN with a Qwen3.5 "
        "checkpoint's MTP head, STANDALONE with a draft model (--speculative-draft-model-path or "
        "--speculative-draft-model-quantization); one step verifies "
        "them (the output is exactly what decoding without drafts gives); default: off.",
        ("NGRAM", "SUFFIX", "NEXTN", "STANDALONE"))
    speculative_draft_model_path: Optional[str] = _arg(
        None, "STANDALONE: the draft model, a checkpoint directory or GGUF file with the target's tokenizer and "
        "vocabulary, attention-only (e.g. the target's own weights in a smaller GGUF format); it runs beside the "
        "target with its own K/V pool of the target's size.")
    speculative_draft_model_quantization: Optional[str] = _arg(
        None, "STANDALONE: the draft model is the target's own weights with every projection and the lm_head "
        "quantized in memory to this format (llama.cpp's reference quantizer), the embedding and norms shared; "
        "instead of --speculative-draft-model-path.", ("q4_0", "q8_0"))
    speculative_num_draft_tokens: int = _arg(_ENGINE.speculative_num_draft_tokens,
                                             "Draft tokens per sequence and step, at most.")
    speculative_token_map: Optional[str] = _arg(
        None, "NEXTN: a file of token ids (JSON list or whitespace-separated), e.g. the most frequent ones; the "
        "MTP head drafts among them only (the verify step keeps the full vocabulary: the output does not change).")
    speculative_ngram_min_match_window_size: int = _arg(_ENGINE.speculative_ngram_min_match_window_size,
                                                        "Shortest n-gram an NGRAM draft matches.")
    speculative_ngram_max_match_window_size: int = _arg(_ENGINE.speculative_ngram_max_match_window_size,
                                                        "Longest n-gram an NGRAM draft matches.")
    speculative_suffix_cache_tokens: int = _arg(
        _ENGINE.speculative_suffix_cache_tokens, "SUFFIX: tokens of recent requests (prompts and outputs) drafts may "
        "come from, oldest out first; an API key's requests draft only from that key's.")
    speculative_step_costs: str = _arg(
        _ENGINE.speculative_step_costs, "How many tokens each sequence drafts: measured chooses, each step, the "
        "lengths of most expected tokens per second from this machine's measured pass costs and each sequence's "
        "acceptance, and drafts nothing where that does not beat decoding (a draft model then skips its passes); "
        "none drafts what the acceptance budgets ask, whatever it costs.", ("measured", "none"))
    watchdog_timeout: float = _arg(300.0, "/health reports unhealthy when one engine step runs longer (s).")
    graceful_shutdown_timeout: float = _arg(5.0, "On SIGTERM/SIGINT, seconds open requests get before the "
                                                 "server exits anyway.")
    timeout_keep_alive: float = _arg(
        75.0, "Seconds an idle keep-alive connection stays open (> 0). Above the pool expiry of the OpenAI and "
        "Anthropic SDKs (httpx: 5 s), Node's (4 s) and the router's (50 s), so those clients never send a request "
        "on a connection the server is closing; a client whose pool keeps connections longer must retry.")


def flag_name(field: dataclasses.Field) -> str:
    return field.name.replace("_", "-")


def _default(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _kind(field: dataclasses.Field) -> type:
    """The flag's type: the annotation with Optional taken off."""
    hint = typing.get_type_hints(ServerArgs)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union else (typing.get_origin(hint) or hint)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines every field as an absl flag (and the aliases)."""
    for field in dataclasses.fields(ServerArgs):
        name, help_text, choices = flag_name(field), field.metadata["help"], field.metadata["choices"]
        default = _default(field)
        kind = _kind(field)
        if choices:
            flags.DEFINE_enum(name, default, list(choices), help_text, flag_values=flag_values)
        elif kind is bool:
            flags.DEFINE_bool(name, default, help_text, flag_values=flag_values)
        elif kind is int:
            flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
        elif kind is float:
            flags.DEFINE_float(name, default, help_text, flag_values=flag_values)
        elif kind is list:
            flags.DEFINE_list(name, default, help_text, flag_values=flag_values)
        else:
            flags.DEFINE_string(name, default, help_text, flag_values=flag_values)
    for alias, target in ALIASES.items():
        flags.DEFINE_alias(alias, target, flag_values=flag_values)


def from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> ServerArgs:
    return ServerArgs(**{f.name: flag_values[flag_name(f)].value for f in dataclasses.fields(ServerArgs)})


def engine_config(args: ServerArgs, **resolved: Any) -> EngineConfig:
    """The engine's config: every EngineConfig field ServerArgs has, then `resolved`
    (the values the server works out itself, such as the pool size)."""
    shared = {f.name for f in dataclasses.fields(EngineConfig)} & {f.name for f in dataclasses.fields(ServerArgs)}
    return EngineConfig(**{**{name: getattr(args, name) for name in shared}, **resolved})


def flag_table() -> str:
    """The Markdown table of every flag, as docs/serving.md holds it (`python -m
    rvascend.server.server_args` prints it)."""
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for field in dataclasses.fields(ServerArgs):
        default = _default(field)
        shown = "" if default in (None, []) else f"`{default}`"
        choices = field.metadata["choices"]
        what = field.metadata["help"].replace("|", "\\|") + (f" One of: {', '.join(choices)}." if choices else "")
        rows.append(f"| `--{flag_name(field)}` | {shown} | {what} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(flag_table(), end="")

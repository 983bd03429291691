"""One llama.cpp run for bench/llama_cpp_peer.py, executed by the llama-cpp-python venv's
interpreter (llama_cpp and numpy only; rvascend is not importable there).

B sequences of random prompt ids go through llama.cpp's own batch API: one
llama_decode for the whole prefill (B x input_len tokens), then one per decode step
(B tokens), greedy. Every call is timed by itself, including reading the logits and
picking the tokens, as this engine's steps are. After the warm-up, --repeats timed
runs, summarized as one_batch does. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import time

import llama_cpp as L
import numpy as np


def _peak_rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _fill(batch, entries: list[tuple[int, int, int, bool]]) -> None:
    """entries: (token, position, sequence, wants logits)."""
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
    batch.n_tokens = len(entries)


def _greedy(ctx, index: int, n_vocab: int) -> int:
    logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
    return int(logits.argmax())


_FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
           "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
           "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
           "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "iq4_xs": "LLAMA_FTYPE_MOSTLY_IQ4_XS"}


def quantize(source: str, output: str, ftype: str, threads: int) -> None:
    """llama.cpp's own quantizer with its default recipe (what `llama-quantize SRC OUT Q4_0` writes)."""
    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, _FTYPES[ftype])
    params.nthread = threads
    if L.llama_model_quantize(source.encode(), output.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {ftype}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize-from", help="Write --model from this GGUF in --ftype, then exit.")
    ap.add_argument("--ftype", choices=sorted(_FTYPES))
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    B, n_in, n_out = a.batch_size, a.input_len, a.output_len
    if a.quantize_from:
        quantize(a.quantize_from, a.model, a.ftype, a.threads)
        return

    L.llama_backend_init()
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(a.model.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {a.model}")
    params = L.llama_context_default_params()
    params.n_ctx = B * (n_in + n_out) + 64
    params.n_batch = params.n_ubatch = max(B * n_in, 512)
    params.n_seq_max = B
    params.n_threads = params.n_threads_batch = a.threads
    ctx = L.llama_init_from_model(model, params)
    load_seconds = time.perf_counter() - t0
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(B * n_in, 0, B)
    rng = random.Random(0)
    runs = []
    for attempt in range(a.warmup + a.repeats):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        prompts = [[rng.randrange(n_vocab) for _ in range(n_in)] for _ in range(B)]
        _fill(batch, [(tok, i, s, i == n_in - 1) for s, p in enumerate(prompts) for i, tok in enumerate(p)])
        steps = []
        t = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed on the prefill")
        tokens = [_greedy(ctx, s * n_in + n_in - 1, n_vocab) for s in range(B)]
        steps.append(time.perf_counter() - t)
        for step in range(n_out - 1):
            _fill(batch, [(tokens[s], n_in + step, s, True) for s in range(B)])
            t = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed on a decode step")
            tokens = [_greedy(ctx, s, n_vocab) for s in range(B)]
            steps.append(time.perf_counter() - t)
        if attempt >= a.warmup:
            runs.append(steps)
    # As one_batch.summarize_runs: the median prefill and total, the median decode step of all runs.
    prefill = statistics.median(r[0] for r in runs)
    decode = [t for r in runs for t in r[1:]]
    median = statistics.median(decode) if decode else float("nan")
    total = statistics.median(sum(r) for r in runs)
    print(json.dumps({
        "prefill_latency": prefill, "prefill_throughput": B * n_in / prefill, "ttft": prefill,
        "median_decode_latency": median, "median_decode_throughput": B / median,
        "total_latency": total, "overall_throughput": B * (n_in + n_out) / total,
        "peak_rss_mib": _peak_rss_mib(), "load_seconds": load_seconds,
        "llama_cpp_python": L.__version__, "system_info": ctypes.string_at(L.llama_print_system_info()).decode(),
    }))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()

"""A time model of one decode step on the SpacemiT K1 (BPI-F3), from counted instructions.

Per region r of the step: time_r = max(compute_r, memory_r), with
  compute_r = (scalar_r / IPC + vector_r * CPI_VECTOR) / (CLOCK_HZ * threads_r)
  memory_r  = bytes_r / bandwidth(threads_r)
and tokens/s = sequences per step / sum of time_r.

The hardware facts, and where they come from:
- 8 X60 cores at 1.6 GHz, RVV 1.0 with VLEN 256 (SpacemiT's K1 product brief;
  Banana Pi BPI-F3 documentation).
- The X60 is dual-issue and in order; IPC = 1.0 for scalar code is this
  model's assumption for interpreter/ATen code on such a core (cache misses
  and branches keep it well under the issue width of 2).
- Vector datapath 128 bits wide, two vector pipes (the issue's description of
  the X60, from SpacemiT's public material): an e32 m4 instruction at VLEN
  256 is 1024 bits = 8 beats on one pipe, so CPI_VECTOR = 4 with both pipes
  busy. The project's kernels use m4/m8 groups; m4 is the model's average.
- DRAM about 7 GB/s with all cores (ANCHORS.md, measured on the board by the
  seed's authors; 10.66 GB/s theoretical), about 2.6 GB/s for one thread
  (sbc-bench's single-thread memcpy on a BPI-F3).
Threads per region: the packed Linear kernels and the attention kernel split
their work over the thread pool (up to 8 threads); ATen's GEMM under OpenMP
likewise; every other region (small ATen ops, Python, the engine) runs on
one thread, as torch 2.6's scalar ATen does for tensors this small.
"""

from __future__ import annotations

import dataclasses

CLOCK_HZ = 1.6e9
CORES = 8
IPC_SCALAR = 1.0
CPI_VECTOR = 4.0
BANDWIDTH_ALL_CORES = 7.0e9   # bytes/s
BANDWIDTH_ONE_THREAD = 2.6e9  # bytes/s

# Every packed projection (a hybrid's in_proj / out_proj too) and attention.
PARALLEL_REGIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "in_proj", "out_proj", "attention")


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    instructions: float
    vector_instructions: float
    bytes: float  # DRAM traffic the region cannot avoid (weights, K/V)


def region_seconds(r: Region, threads: int, ipc: float = IPC_SCALAR) -> float:
    t = threads if r.name in PARALLEL_REGIONS else 1
    scalar = r.instructions - r.vector_instructions
    compute = (scalar / ipc + r.vector_instructions * CPI_VECTOR) / (CLOCK_HZ * t)
    bandwidth = BANDWIDTH_ALL_CORES if t > 1 else BANDWIDTH_ONE_THREAD
    return max(compute, r.bytes / bandwidth)


def tokens_per_second(regions: list[Region], sequences: int, threads: int, ipc: float = IPC_SCALAR) -> float:
    """`ipc`: scalar instructions per cycle (the model's 1.0; 0.5 is the conservative case)."""
    return sequences / sum(region_seconds(r, threads, ipc) for r in regions)


def unavoidable_bytes(region: str, config: dict, context: int, layers: int, kv_reads: float = 1.0,
                      bytes_per_weight: float = 2.0, sequences: int = 1) -> float:
    """Weight bytes of a projection (BF16: 2 per weight; Q4_0: 18/32, Q8_0: 34/32), K/V bytes
    attention reads, or the Gated DeltaNet states read and written, for `layers` layers."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    types = config.get("layer_types")
    # A hybrid's (Qwen3.5) layers: full attention (q_proj also yields the output gate) or Gated DeltaNet.
    full = layers if types is None else layers * types.count("full_attention") / len(types)
    linear = layers - full
    q_rows = (2 if types else 1) * heads * d
    weights = {"qkv_proj": (h * (q_rows + 2 * kv_heads * d), full), "o_proj": (heads * d * h, full),
               "gate_up_proj": (2 * h * inter, layers), "down_proj": (inter * h, layers)}
    if types:
        nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        weights["in_proj"] = (h * (2 * nk * dk + 2 * nv * dv + 2 * nv), linear)
        weights["out_proj"] = (nv * dv * h, linear)
        if region == "deltanet":  # the FP32 state, read and written once per token
            return 2.0 * 4 * nv * dv * dk * linear * sequences
    if region in weights:
        per_layer, count = weights[region]
        return bytes_per_weight * per_layer * count
    if region == "lm_head":
        return bytes_per_weight * vocab * h
    if region == "attention":
        return 2.0 * 2 * context * kv_heads * d * full * kv_reads
    return 0.0

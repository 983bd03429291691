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
Threads per region: the packed Linear kernels, the attention kernel and the Gated
DeltaNet op (its (sequence, value head) units, its conv's channels) split their work
over the thread pool (up to 8 threads); ATen's GEMM under OpenMP likewise; the
elementwise kernels (RMSNorm, SiLU*mul, RoPE, the output gate) split a step's rows,
so they run on as many threads as the step has rows (a prompt's tokens; one thread for
one decoding sequence); every other region (small ATen ops, Python, the engine) runs
on one thread, as torch 2.6's scalar ATen does for tensors this small.
"""

from __future__ import annotations

import dataclasses

CLOCK_HZ = 1.6e9
CORES = 8
IPC_SCALAR = 1.0
CPI_VECTOR = 4.0
BANDWIDTH_ALL_CORES = 7.0e9   # bytes/s
BANDWIDTH_ONE_THREAD = 2.6e9  # bytes/s


@dataclasses.dataclass(frozen=True)
class Board:
    """The time model's constants. `efficiency[t]` is the share of t cores' issue rate the
    counted instructions get (synchronisation, imbalance, two clusters sharing DRAM);
    `bandwidth[t]` the DRAM bytes/s t threads stream. `cpi_kinds` the cycles of a vector
    instruction by kind (qemu_count_plugin.cc's kinds) where the count has them; a kind it
    leaves out, and a count without kinds, take `cpi_vector`."""
    name: str
    clock_hz: float
    ipc_scalar: float
    cpi_vector: float
    bandwidth: dict[int, float]
    efficiency: dict[int, float]
    sources: str
    cpi_kinds: dict[str, float] = dataclasses.field(default_factory=dict)

    @staticmethod
    def _at(table: dict[int, float], threads: int) -> float:
        """The entry for the largest thread count up to `threads` (the smallest one below all)."""
        known = sorted(table)
        below = [t for t in known if t <= threads]
        return table[below[-1] if below else known[0]]

    def bandwidth_at(self, threads: int) -> float:
        return self._at(self.bandwidth, threads)

    def vector_cycles(self, vector: float, kinds: dict[str, float] | None = None) -> float:
        """Cycles of `vector` vector instructions, `kinds` of them by kind."""
        if not kinds or not self.cpi_kinds:
            return vector * self.cpi_vector
        by_kind = sum(n * self.cpi_kinds.get(kind, self.cpi_vector) for kind, n in kinds.items())
        return by_kind + (vector - sum(kinds.values())) * self.cpi_vector

    def compute_seconds(self, instructions: float, vector: float, threads: int, ipc: float | None = None,
                        kinds: dict[str, float] | None = None) -> float:
        scalar = instructions - vector
        cycles = scalar / (ipc or self.ipc_scalar) + self.vector_cycles(vector, kinds)
        return cycles / (self.clock_hz * threads * self._at(self.efficiency, threads))

    def seconds(self, instructions: float, vector: float, bytes_: float, threads: int,
                ipc: float | None = None, kinds: dict[str, float] | None = None) -> float:
        """A step's time: its compute or its DRAM traffic, whichever is longer."""
        return max(self.compute_seconds(instructions, vector, threads, ipc, kinds),
                   bytes_ / self.bandwidth_at(threads))


# The constants the projections used before any measured board was compared with them.
ASSUMED = Board(
    "assumed", CLOCK_HZ, IPC_SCALAR, CPI_VECTOR, {1: BANDWIDTH_ONE_THREAD, 2: BANDWIDTH_ALL_CORES},
    {1: 1.0}, "this module's docstring: product briefs, sbc-bench's memcpy, IPC and CPI assumed")


# Fitted by bench/calibration/fit.py (`python -m rvascend.bench.calibration.fit`) to public
# llama-bench measurements of plain-RVV llama.cpp on a BPI-F3 (bench/calibration/public_points.json:
# TinyLlama-1.1B in Q2_K, repacked and vec_dot, from llama.cpp PR #19121, IQ4_NL from #18859 and
# Q3_K (vec_dot) from #23745, Q5_K (vec_dot) from #20723, 8 threads), each projected from llama.cpp's own riscv64 build counted
# under QEMU on a file of the same model and type (bench/calibration/counted_llama_cpp.jsonl, whose
# sha256 is below; a prompt composed from one- and two-layer models, bench/llama_cpp_riscv64.compose),
# its vector instructions counted by kind (qemu_count_plugin.cc). 15 points fitted, 16 held out (#20723's
# five Q5_K prompts among them: a type the fit never saw, projected within 4.4-11.2 %). What
# the points constrain: scalar IPC (at its bound, the X60's issue width of 2) and a cycle cost per
# kind of vector instruction at 8 threads: memory accesses 5.35, vset{i}vl{i} 3.6, reductions 2.7,
# the arithmetic 1.39 (the per-core rates are fitted at 8 threads, so the 4-thread projection assumes
# the same rates: no public plain-RVV point at 4 threads names its model). cpi_vector is the points'
# mix of kinds at those costs, for a count without kinds. No point is bound by DRAM, so the
# bandwidths stay the assumed ones. The largest residuals: the board runs prompts of 32 and 64
# tokens faster than longer ones (Q2_K vec_dot: 9.69 tok/s at 32, 7.47 at 512) while llama.cpp's
# counted instructions per prompt token stay within 1 % from 32 to 256 tokens, a trend no constant
# of this model can follow.
# The 4-thread bandwidth is a measured floor, not the all-core figure: SpacemiT's IME build generates
# Qwen3-0.6B Q4_0 at 11.73 tok/s on four cores (docs/build-riscv64-spacemit.md), and each of those
# tokens reads at least the file's 375 MB and its K/V, so four cores stream at least 4.49 GB/s; no
# measurement shows more, so the board takes that floor (fit.bandwidth_floors; its Qwen3.5-2B Q4_1
# point, 3.07 tok/s, implies 4.04).
CALIBRATION_COUNTS_SHA256 = "03473ec2d839abc1d0103d2ecb3776972febf799e80023a9d52760086728f930"
CALIBRATION_ERRORS = (0.222, 0.228)  # largest |measured / projected - 1|: fitted points, held-out points
CALIBRATED = Board(
    "calibrated", CLOCK_HZ, 2.0, 2.643371148668176,
    {1: BANDWIDTH_ONE_THREAD, 4: 4488981288.96, 8: 6999967867.8275175}, {1: 1.0},
    "bench/calibration: llama.cpp PRs #19121, #18859, #23745 and #20723 on a BPI-F3, fitted to llama.cpp counted "
    "under QEMU; the 4-thread bandwidth, the floor SpacemiT's IME generation figures set",
    cpi_kinds={"reduction": 2.673002986086875, "memory": 5.346562861575229, "config": 3.590981481225598,
               "multiply": 1.3893167996541733, "integer": 1.3893167996541733, "float": 1.3893167996541733,
               "permute": 1.3893167996541733})


# The K3's X100 cores on paper (bench/calibration/k3_board.py). No plain-RVV llama.cpp figure on
# them is public, so nothing is fitted: CALIBRATED with each vector kind's cycles times the X100 /
# X60 ratio of rvv-bench's measured instruction throughputs (x100_over_x60.json: the geometric mean
# over the kind's instructions at the kernels' SEW/LMUL; the tables time no vset{i}vl{i}, which keeps
# the K1's cycles), scalar IPC divided by the ratio of a scalar add's, the X100's 2.4 GHz (rvv-bench's
# X100 page), and DRAM at the floor SpacemiT's IME2 generation sets: Qwen3-4B Q4_0 at 11.29 tok/s on
# eight A100 cores (llama.cpp docs/build-riscv64-spacemit.md) from a 2.21 GiB file whose tied embedding
# is read whole for every token, so the K3's DRAM streams at least 26.8 GB/s to eight cores (its
# Qwen3-0.6B and Qwen3.5-2B figures imply 21). Eight threads only: no K3 figure at four names its bytes.
X100_OVER_X60 = {"float": 0.9616, "integer": 0.8784, "memory": 0.7753, "multiply": 0.9981, "permute": 0.8955,
                 "reduction": 0.6242, "scalar": 0.7581, "vector": 0.8611}
K3_CLOCK_HZ = 2.4e9
K3_BANDWIDTH = 2.21 * 2**30 * 11.29  # bytes/s, eight threads
K3_ON_PAPER = Board(
    "k3_on_paper", K3_CLOCK_HZ, CALIBRATED.ipc_scalar / X100_OVER_X60["scalar"],
    CALIBRATED.cpi_vector * X100_OVER_X60["vector"], {8: K3_BANDWIDTH}, {1: 1.0},
    "the calibrated K1 board scaled by rvv-bench's X100 / X60 instruction throughputs, at 2.4 GHz, DRAM at "
    "the floor SpacemiT's IME2 Qwen3-4B generation sets",
    cpi_kinds={k: c * X100_OVER_X60.get(k, 1.0) for k, c in CALIBRATED.cpi_kinds.items()})


def qemu_cpu(vlen: int = 256) -> str:
    """QEMU's -cpu for the K1's X60 cores as counted here: RVV 1.0 at `vlen` with the scalar
    and vector half-precision extensions (Zfh, Zvfh) and the cache-block prefetch and pause
    hints llama.cpp's riscv64 build uses (SpacemiT's K1 ISA string lists them all)."""
    return f"rv64,v=true,vext_spec=v1.0,vlen={vlen},zfh=true,zvfh=true,zicbop=true,zihintpause=true"


# Every packed projection (a hybrid's in_proj / out_proj too), attention and the Gated DeltaNet op.
PARALLEL_REGIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "in_proj", "out_proj", "attention",
                    "deltanet")
# The elementwise kernels' regions (rvv_kernels/elementwise: one row, or one token's heads, per task).
ROW_PARALLEL_REGIONS = ("rms_norm", "silu_mul", "qk_norm_rope", "output_gate")


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    instructions: float
    vector_instructions: float
    bytes: float  # DRAM traffic the region cannot avoid (weights, K/V)
    vector_kinds: dict[str, float] | None = None  # the vector instructions by kind, where counted


def region_threads(name: str, threads: int, rows: int = 1) -> int:
    """The threads region `name` of a step of `rows` rows (tokens) runs on, of `threads`."""
    if name in PARALLEL_REGIONS:
        return threads
    return max(1, min(threads, rows)) if name in ROW_PARALLEL_REGIONS else 1


def region_seconds(r: Region, threads: int, ipc: float | None = None, board: Board = ASSUMED, rows: int = 1) -> float:
    return board.seconds(r.instructions, r.vector_instructions, r.bytes, region_threads(r.name, threads, rows), ipc,
                         r.vector_kinds)


def tokens_per_second(regions: list[Region], sequences: int, threads: int, ipc: float | None = None,
                      board: Board = ASSUMED, rows: int = 1) -> float:
    """`ipc`: scalar instructions per cycle (the board's own when None; 0.5 is the conservative case);
    `rows`: the step's rows (tokens), over which the elementwise kernels split."""
    return sequences / sum(region_seconds(r, threads, ipc, board, rows) for r in regions)


def unavoidable_bytes(region: str, config: dict, context: int, layers: int, kv_reads: float = 1.0,
                      bytes_per_weight: float = 2.0, sequences: int = 1, tokens: int = 1, drafts: int = 0,
                      draft_vocab: int = 0) -> float:
    """Weight bytes of a projection (BF16: 2 per weight; Q4_0: 18/32, Q8_0: 34/32), K/V bytes
    attention reads, or the Gated DeltaNet states read and written, for `layers` layers. A
    speculative verify step runs `tokens` per sequence (each keeps its own state); an MTP
    head's `drafts` passes (mtp_draft) each stream its layer, its fc and the lm_head (its first
    `draft_vocab` rows when drafts come from a draft vocabulary)."""
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
        if region == "deltanet":  # the FP32 state, read once and written once per token
            return (1.0 + tokens) * 4 * nv * dv * dk * linear * sequences
    if region in weights:
        per_layer, count = weights[region]
        return bytes_per_weight * per_layer * count
    if region == "lm_head":
        return bytes_per_weight * vocab * h
    if region == "mtp_draft":  # one full-attention layer, fc [h, 2h] and the lm_head, per draft pass
        layer = sum(per_layer for name, (per_layer, _) in weights.items() if name in (
            "qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
        kv = 2.0 * 2 * context * kv_heads * d
        return drafts * (bytes_per_weight * (layer + 2 * h * h + (draft_vocab or vocab) * h) + kv)
    if region == "attention":
        return 2.0 * 2 * context * kv_heads * d * full * kv_reads
    return 0.0

"""The K1 board model fitted to public plain-RVV llama.cpp measurements.

  python -m rvascend.bench.calibration.fit [--counts=FILE]

Inputs, both checked in next to this file:
- public_points.json: llama-bench figures from llama.cpp's PRs, each with its source, the
  thread count and the llama.cpp version it was measured on;
- counted_llama_cpp.jsonl: llama.cpp's own riscv64 build counted under QEMU on files of
  the same model and type (bench/llama_cpp_riscv64.py; its records, manifest included).

A point's projection is the counted test (a P-token prompt, or a generated token at the
point's context) timed by a k1_model.Board. The free constants, scalar IPC, cycles per
vector instruction of each kind group (KIND_GROUPS; one for every vector instruction
when the counts have no kinds) and DRAM bandwidth at the points' thread count, minimise
the squared log error over the points not held out, plus a weak pull toward the assumed
board's values (PRIOR_WEIGHT; Nelder-Mead over their logarithms, from the assumed
board). Points measured with SpacemiT's IME matrix backend ("backend": "ime") run code
QEMU does not count, so they time nothing; each still read its file's weights every
generated token, so it bounds the DRAM bandwidth at its thread count from below
(bandwidth_floors), and where no counted point fits the bandwidth at that thread count
the board takes that floor in place of the assumed figure. Printed: every point with
measured / projected, and the error of the fit and of the held-out points apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Callable, Sequence

from absl import app, flags

from rvascend.bench import k1_model
from rvascend.bench.results import print_table

HERE = os.path.dirname(os.path.abspath(__file__))
POINTS = os.path.join(HERE, "public_points.json")
COUNTS = os.path.join(HERE, "counted_llama_cpp.jsonl")
FLAGS = flags.FLAGS
# Weight of the pull toward the assumed constants, per squared log: a factor e away from
# a cited value costs as much as a 10 % misfit of one point.
PRIOR_WEIGHT = 0.01
# Vector instruction kinds (qemu_count_plugin.cc) that share one fitted cost: a reduction
# (vredsum and kin: the X60 runs it as a tree over the whole register group), a memory
# access, a vset{i}vl{i}, and the arithmetic and permutations.
KIND_GROUPS: dict[str, tuple[str, ...]] = {
    "reduction": ("reduction",), "memory": ("memory",), "config": ("config",),
    "arithmetic": ("multiply", "integer", "float", "permute")}


def load_points(path: str = POINTS) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["points"]


def load_counts(path: str = COUNTS) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model, type, variant) -> the latest llama_cpp_riscv64 record of it, its prompts composed
    again from the runs it keeps (llama_cpp_riscv64.compose as it is now, not as it was when
    the record was written)."""
    counts = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("bench") == "llama_cpp_riscv64":
                counts[(record["model"], record["type"], record["variant"])] = recomposed(record)
    return counts


def recomposed(record: dict[str, Any]) -> dict[str, Any]:
    """A llama_cpp_riscv64 record with its prompts composed again from the runs it keeps."""
    from rvascend.bench import llama_cpp_riscv64

    if record.get("one_layer_runs") and record.get("two_layer_runs"):
        composed = llama_cpp_riscv64.composed_record(record)
        record = {**record, "prefill": {str(p): list(v) for p, v in composed.prefill.items()},
                  "prefill_kinds": {str(p): v for p, v in composed.prefill_kinds.items()},
                  "prefill_check": composed.prefill_check}
    return record


def step_bytes(record: dict[str, Any], context: int) -> float:
    """DRAM bytes llama.cpp's step on a counted record's file cannot avoid at `context`: the
    file's matrices, the K/V its attention reads (F16, as this engine's projection counts
    them) and a hybrid's Gated DeltaNet states, read and written once."""
    from rvascend.models import random_checkpoint

    config = random_checkpoint.SHAPES[record["model"]]
    layers = config["num_hidden_layers"]
    return record["decode_weight_bytes"] + sum(k1_model.unavoidable_bytes(r, config, context, layers)
                                               for r in ("attention", "deltanet"))


def llama_cpp_tok_s(record: dict[str, Any], prefill: bool, length: float, threads: int,
                    board: k1_model.Board) -> float:
    """llama.cpp's projected tok/s on a counted record: a `length`-token prompt (it reads the
    weights once), or a token generated at the counted context nearest `length`; its DRAM
    traffic, step_bytes."""
    if prefill:
        context, tokens = int(length), int(length)
        key, step = str(context), "prefill"
    else:
        key = min(record["decode"], key=lambda c: abs(int(c) - length))
        context, tokens, step = int(key), 1, "decode"
    n, v = record[step][key]
    kinds = record.get(f"{step}_kinds", {}).get(key)
    return tokens / board.seconds(n, v, step_bytes(record, context), threads, kinds=kinds)


def _context(point: dict[str, Any]) -> float:
    """The context a point's test runs at: its prompt, or the middle of its generated tokens."""
    return point["length"] if point["test"] == "pp" else point["prompt"] + point["length"] / 2


def _record_of(point: dict[str, Any], counts: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any] | None:
    """The counted record of a point's file: its own variant's, or (an IME point, whose code
    is not llama.cpp's) any variant's, for the file's bytes."""
    if point.get("backend") != "ime":
        return counts.get((point["model"], point["type"], point["variant"]))
    return next((r for (m, t, _), r in sorted(counts.items()) if (m, t) == (point["model"], point["type"])), None)


def _ime_generation(points: list[dict[str, Any]], counts: dict[tuple[str, str, str], dict[str, Any]]
                    ) -> list[tuple[dict[str, Any], float]]:
    """The generation points measured with IME whose file was counted, each with the bytes
    (step_bytes) one of its generated tokens read at least."""
    return [(p, step_bytes(record, round(_context(p)))) for p in points
            if p.get("backend") == "ime" and p["test"] == "tg" and (record := _record_of(p, counts)) is not None]


def bandwidth_floors(points: list[dict[str, Any]], counts: dict[tuple[str, str, str], dict[str, Any]]
                     ) -> dict[int, float]:
    """Thread count -> the least DRAM bandwidth the generation points measured with IME allow:
    each generated token read at least step_bytes of its file, so bandwidth >= tok/s x bytes."""
    floors: dict[int, float] = {}
    for p, bytes_ in _ime_generation(points, counts):
        floors[p["threads"]] = max(floors.get(p["threads"], 0.0), p["tok_s"] * bytes_)
    return floors


def project(board: k1_model.Board, point: dict[str, Any], record: dict[str, Any]) -> float:
    """A public point's test projected: pp as its prompt, tg as the token in the middle of
    its generated ones."""
    return llama_cpp_tok_s(record, point["test"] == "pp", _context(point), point["threads"], board)


# What the core can do at most, whatever fits the points best: the X60 issues two
# instructions a cycle, and its two vector pipes retire at most two vector instructions
# a cycle (CPI 0.5).
MAX_IPC = 2.0
MIN_CPI = 0.5


def _board(x: Sequence[float], threads: int, base: k1_model.Board, groups: dict[str, tuple[str, ...]]
           ) -> k1_model.Board:
    """x: the logarithms of scalar IPC, CPI, bandwidth at `threads`, then each group's CPI
    (held within MAX_IPC and MIN_CPI)."""
    ipc, cpi, bandwidth, *group_cpi = (math.exp(v) for v in x)
    ipc, cpi = min(ipc, MAX_IPC), max(cpi, MIN_CPI)
    group_cpi = [max(c, MIN_CPI) for c in group_cpi]
    cpi_kinds = {kind: c for c, members in zip(group_cpi, groups.values()) for kind in members}
    return dataclasses.replace(base, name="fitted", ipc_scalar=ipc, cpi_vector=cpi, cpi_kinds=cpi_kinds,
                               bandwidth={**base.bandwidth, threads: bandwidth}, efficiency={threads: 1.0})


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.3,
                iterations: int = 2000, tolerance: float = 1e-12) -> list[float]:
    """The minimum of `f` near `x0` (the simplex method; deterministic)."""
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=lambda i: values[i])
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / (len(simplex) - 1) for j in range(len(x0))]

        def toward(t: float) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centroid, simplex[-1])]

        reflected = toward(-1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = toward(-2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = toward(0.5)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink toward the best
                simplex = [simplex[0]] + [[b + 0.5 * (x - b) for b, x in zip(simplex[0], s)] for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[min(range(len(simplex)), key=lambda i: values[i])]


@dataclasses.dataclass(frozen=True)
class Fit:
    board: k1_model.Board
    rows: list[dict[str, Any]]
    fit_error: float       # largest |measured / projected - 1| over the fitted points
    held_out_error: float  # the same over the held-out points


def _has_kinds(record: dict[str, Any]) -> bool:
    return bool(record.get("prefill_kinds")) and bool(record.get("decode_kinds"))


def _kind_mix(points: list[dict[str, Any]], counts: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, float]:
    """The points' vector instructions by kind, each point's test weighted alike."""
    mix: dict[str, float] = {}
    for p in points:
        record = counts[(p["model"], p["type"], p["variant"])]
        step = "prefill" if p["test"] == "pp" else "decode"
        kinds = next(iter(record[f"{step}_kinds"].values()))
        total = sum(kinds.values()) or 1.0
        for kind, n in kinds.items():
            mix[kind] = mix.get(kind, 0.0) + n / total
    return mix


def fit(points: list[dict[str, Any]], counts: dict[tuple[str, str, str], dict[str, Any]],
        base: k1_model.Board = k1_model.ASSUMED, prior_weight: float = PRIOR_WEIGHT,
        groups: dict[str, tuple[str, ...]] | None = None) -> Fit:
    """`groups`: KIND_GROUPS when every counted record has its vector instructions by kind,
    else none (one CPI for every vector instruction)."""
    usable = [p for p in points if p.get("backend") != "ime" and (p["model"], p["type"], p["variant"]) in counts]
    if groups is None:
        groups = KIND_GROUPS if usable and all(_has_kinds(counts[(p["model"], p["type"], p["variant"])])
                                               for p in usable) else {}
    threads = {p["threads"] for p in usable}
    if len(threads) != 1 or not any(not p["held_out"] for p in usable):
        raise ValueError(f"the fit needs points at one thread count with some not held out; got {sorted(threads)}")
    (t,) = threads
    training = [p for p in usable if not p["held_out"]]

    x0 = [math.log(base.ipc_scalar), math.log(base.cpi_vector), math.log(base.bandwidth_at(t))]
    x0 += [math.log(base.cpi_vector)] * len(groups)

    def loss(x: list[float]) -> float:
        board = _board(x, t, base, groups)
        misfit = sum(math.log(p["tok_s"] / project(board, p, counts[(p["model"], p["type"], p["variant"])])) ** 2
                     for p in training)
        # A weak pull toward the assumed constants: a constant the points do not constrain (no
        # point bound by DRAM, say) stays near its cited value instead of drifting to 0 or infinity.
        return misfit + prior_weight * sum((a - b) ** 2 for a, b in zip(x, x0))

    board = _board(nelder_mead(loss, x0, iterations=4000 if groups else 2000), t, base, groups)
    if groups:
        # A count without kinds takes the cost of the points' own mix of kinds.
        mix = _kind_mix(training, counts)
        board = dataclasses.replace(board, cpi_vector=sum(board.cpi_kinds.get(k, board.cpi_vector) * n
                                                          for k, n in mix.items()) / sum(mix.values()))
    # Where no counted point fits the bandwidth, the IME runs' floor replaces the assumed figure.
    floors = bandwidth_floors(points, counts)
    bandwidth = {**board.bandwidth, **{n: max(floor, board.bandwidth[n]) if n == t else floor
                                       for n, floor in floors.items()}}
    # Fewer threads stream no more than more threads do (the assumed board's all-core figure
    # from 2 threads up would otherwise stand above a floor set at 4).
    board = dataclasses.replace(board, bandwidth={n: min(bw for m, bw in bandwidth.items() if m >= n)
                                                  for n in bandwidth})
    rows = []
    for p, bytes_ in _ime_generation(points, counts):
        projected = board.bandwidth_at(p["threads"]) / bytes_
        rows.append({"id": p["id"], "model": p["model"], "type": p["type"], "variant": "IME",
                     "threads": p["threads"], "test": f"{p['test']}{p['length']}", "measured": p["tok_s"],
                     "projected": projected, "ratio": p["tok_s"] / projected, "assumed_projected": float("nan"),
                     "held_out": None, "role": "bandwidth floor"})
    for p in usable:
        projected = project(board, p, counts[(p["model"], p["type"], p["variant"])])
        assumed = project(base, p, counts[(p["model"], p["type"], p["variant"])])
        rows.append({"id": p["id"], "model": p["model"], "type": p["type"], "variant": p["variant"],
                     "threads": p["threads"], "test": f"{p['test']}{p['length']}", "measured": p["tok_s"],
                     "projected": projected, "ratio": p["tok_s"] / projected, "assumed_projected": assumed,
                     "held_out": p["held_out"], "role": "held out" if p["held_out"] else "fitted"})
    worst = {held: max((abs(r["ratio"] - 1) for r in rows if r["held_out"] == held), default=0.0)
             for held in (False, True)}
    return Fit(board, rows, worst[False], worst[True])


def main(argv: list[str]) -> int:
    del argv
    result = fit(load_points(), load_counts(FLAGS.counts))
    print_table(result.rows, [("id", "point", "s"), ("test", "test", "s"), ("measured", "measured tok/s", ".2f"),
                              ("projected", "calibrated", ".2f"), ("ratio", "measured/proj.", ".3f"),
                              ("assumed_projected", "assumed board", ".2f"), ("role", "role", "s")])
    b = result.board
    if b.cpi_kinds:
        print("vector CPI by kind: " + ", ".join(f"{k} {c:.3f}" for k, c in b.cpi_kinds.items()))
    print(f"fitted: scalar IPC {b.ipc_scalar:.4f}, vector CPI {b.cpi_vector:.4f}, bandwidth "
          + ", ".join(f"{t} threads {bw / 1e9:.3f} GB/s" for t, bw in sorted(b.bandwidth.items())))
    print(f"largest |measured/projected - 1|: fitted points {result.fit_error:.1%}, held out "
          f"{result.held_out_error:.1%}")
    return 0


if __name__ == "__main__":
    flags.DEFINE_string("counts", COUNTS, "llama_cpp_riscv64 jsonl records to project.")
    sys.exit(app.run(main))

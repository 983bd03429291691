"""This engine beside llama.cpp on the same GGUF files, both projected on the K1 by one board model.

  python -m rvascend.bench.calibration.board_table --ours=riscv64_step.jsonl --llama_cpp=llama_cpp_riscv64.jsonl

Ours: bench/riscv64_step.py records made with --gguf_source=llama_cpp (the step's regions
with their vector counts; projections, regions in parallel as the thread pool runs them).
llama.cpp's: bench/llama_cpp_riscv64.py records of the same files (every op split over
the threads, as ggml does). Both under k1_model.CALIBRATED (and ASSUMED beside it), at 4
and 8 threads, and under k1_model.K3_ON_PAPER (the K3's X100 cores on paper) at 8;
llama.cpp at its faster variant (repacked or vec_dot) for each row. The ratio ours /
llama.cpp is the headline: one board model, one file, one thread count.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app, flags

from rvascend.bench import k1_model
from rvascend.bench.calibration.fit import llama_cpp_tok_s, recomposed
from rvascend.bench.riscv64_step import project_record
from rvascend.bench.results import print_table

FLAGS = flags.FLAGS
THREADS = (4, 8)


def _read(path: str, bench: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [r for r in (json.loads(line) for line in f) if r.get("bench") == bench]


def rows(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], board: k1_model.Board,
         threads: tuple[int, ...] = THREADS) -> list[dict[str, Any]]:
    by_file: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in theirs:
        by_file.setdefault((r["model"], r["type"]), []).append(r)
    table = []
    for r in ours:
        peers = by_file.get((r["shape"], r["mode"]), [])
        if r["kind"] == "prefill":  # the prompt lengths llama.cpp was counted at
            peers = [p for p in peers if str(r["context"]) in p["prefill"]]
        if not peers or r["rows"] != 1:
            continue
        row = {"model": r["shape"], "type": r["mode"], "step": r["kind"], "length": r["context"]}
        for t in threads:
            row[f"ours_{t}"] = project_record(r, t, board)
            speeds = {p["variant"]: llama_cpp_tok_s(p, r["kind"] == "prefill", r["context"], t, board) for p in peers}
            variant = max(speeds, key=speeds.get)
            row[f"llama_cpp_{t}"], row[f"llama_cpp_variant_{t}"] = speeds[variant], variant
            row[f"ratio_{t}"] = row[f"ours_{t}"] / speeds[variant]
        row["ratio_best"] = max(row[f"ours_{t}"] for t in threads) / max(row[f"llama_cpp_{t}"] for t in threads)
        table.append(row)
    return table


def main(argv: list[str]) -> int:
    del argv
    ours = _read(FLAGS.ours, "riscv64_step")
    theirs = [recomposed(r) for r in _read(FLAGS.llama_cpp, "llama_cpp_riscv64")]
    boards = ((k1_model.CALIBRATED, THREADS), (k1_model.ASSUMED, THREADS), (k1_model.K3_ON_PAPER, (8,)))
    for board, threads in boards:
        print(f"\nboard model: {board.name}")
        print_table(rows(ours, theirs, board, threads),
                    [("model", "model", "s"), ("type", "type", "s"), ("step", "step", "s"), ("length", "ctx/prompt", "d")]
                    + [c for t in threads for c in ((f"ours_{t}", f"ours {t}T", ".2f"),
                                                    (f"llama_cpp_{t}", f"llama.cpp {t}T", ".2f"),
                                                    (f"ratio_{t}", f"ratio {t}T", ".2f"))]
                    + ([("ratio_best", "ratio (each at its best T)", ".2f")] if len(threads) > 1 else []))
    return 0


if __name__ == "__main__":
    flags.DEFINE_string("ours", None, "riscv64_step jsonl (made with --gguf_source=llama_cpp).")
    flags.DEFINE_string("llama_cpp", None, "llama_cpp_riscv64 jsonl of the same files.")
    flags.mark_flags_as_required(["ours", "llama_cpp"])
    sys.exit(app.run(main))

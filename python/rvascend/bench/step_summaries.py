"""What riscv64_step's counted steps say together: speculative verify steps against the
decode step, a chat's next turn against prefilling its whole prompt (records as
riscv64_step writes them, with their calibrated K1 projections)."""

from __future__ import annotations

from typing import Any

from rvascend.bench.step_kinds import draft_tokens, turn_tokens


def speculative_summary(records: list[dict[str, Any]], acceptance_length: float) -> list[dict[str, Any]]:
    """Each verify / NEXTN step beside the decode step of its mode, context and rows: its
    instructions and its calibrated K1 time as multiples of the decode step's, and the net
    decode speed-up when a step yields `acceptance_length` tokens per sequence."""
    decode = {(r["vlen"], r["mode"], r["context"], r["rows"]): r for r in records if r["kind"] == "decode"}
    out = []
    for r in records:
        base = decode.get((r["vlen"], r["mode"], r["context"], r["rows"]))
        if base is None or not draft_tokens(r["kind"]):
            continue
        row = {k: r[k] for k in ("vlen", "mode", "kind", "context", "rows")}
        row["insns_per_sequence_vs_decode"] = r["instructions"] / base["instructions"]
        for t in (4, 8):
            # Projections are tokens per second at one token per sequence a step: time ratios.
            ratio = base[f"k1_calibrated_tok_s_{t}_threads"] / r[f"k1_calibrated_tok_s_{t}_threads"]
            row[f"k1_time_vs_decode_{t}t"] = ratio
            row[f"net_at_acceptance_{t}t"] = acceptance_length / ratio
        out.append(row)
    return out


def turn_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each counted chat turn (N tokens after C cached) against prefilling its whole prompt:
    the prompt in chunks of K (one counted prefill of K tokens is the chunk at context 0, a
    counted turnK at context C - K the last chunk; the chunks between are interpolated
    linearly, as attention over the prefix grows linearly in it), then the turn's N tokens.
    Times on the calibrated K1 at 4 and 8 threads (projections)."""
    def seconds(r: dict[str, Any], threads: int) -> float:
        produced = r["rows"] * (turn_tokens(r["kind"]) or r["context"])
        return produced / r[f"k1_calibrated_tok_s_{threads}_threads"]

    out = []
    for turn in (r for r in records if turn_tokens(r["kind"])):
        for chunk in (r for r in records if r["kind"] == "prefill" and r["vlen"] == turn["vlen"]
                      and r["mode"] == turn["mode"]):
            k = chunk["context"]
            last = next((r for r in records if r["kind"] == f"turn{k}" and r["context"] == turn["context"] - k
                         and r["vlen"] == turn["vlen"] and r["mode"] == turn["mode"]), None)
            if last is None or turn["context"] % k:
                continue
            row = {"vlen": turn["vlen"], "cached": turn["context"], "new": turn_tokens(turn["kind"]), "chunk": k}
            for t in (4, 8):
                first_s, last_s = seconds(chunk, t), seconds(last, t)
                chunks = turn["context"] // k
                whole = sum(first_s + (last_s - first_s) * i / (chunks - 1) for i in range(chunks)) + seconds(turn, t)
                row[f"turn_s_{t}t"], row[f"whole_prompt_s_{t}t"] = seconds(turn, t), whole
                row[f"speedup_{t}t"] = whole / seconds(turn, t)
            out.append(row)
    return out

"""The step kinds riscv64_step counts, as its host side and its guest both read them:
"decode", "prefill", "verifyK" (each sequence verifies K draft tokens), "nextnK" (the same
with the MTP head's draft pass inside), "nextnKhN" (the head drafting among the first N
token ids) and "turnN" (N prompt tokens prefilled after a prefix the cache holds: a chat's
next turn)."""

from __future__ import annotations


def draft_tokens(kind: str) -> int:
    """Draft tokens each sequence verifies in a step of this kind; 0 for decode and prefill."""
    for prefix in ("verify", "nextn"):
        if kind.startswith(prefix):
            return int(kind[len(prefix):].split("h")[0])
    return 0


def draft_vocab(kind: str) -> int:
    """The draft vocabulary of a "nextnKhN" step (N), else 0 (the whole vocabulary)."""
    return int(kind.split("h")[1]) if kind.startswith("nextn") and "h" in kind else 0


def turn_tokens(kind: str) -> int:
    """The new prompt tokens of a "turnN" step (N), else 0."""
    return int(kind[len("turn"):]) if kind.startswith("turn") else 0

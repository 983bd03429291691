"""N-gram drafting for speculative decoding (SGLang's `--speculative-algorithm NGRAM`):
draft tokens come from the request's own prompt and output, no extra weights.

The last n tokens (n from the largest window down to the smallest) are looked up
earlier in the sequence; the tokens that followed their most recent earlier
occurrence are the draft. Text that repeats itself (code edits, quoting, lists,
summaries of the prompt) drafts well; free generation rarely matches, and then no
draft is made and the step is a plain decode step.

Each sequence also keeps how well its drafts do (DraftBudget): the verify step
costs more rows than a decode step, so a sequence whose drafts keep failing drafts
fewer tokens, then none for a while, then probes again.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

# Below this share of drafted tokens accepted (a moving average), a sequence stops
# drafting for PAUSE_STEPS steps, twice as long after each pause that ended in failure
# again (up to MAX_PAUSE_STEPS): drafts accepted less often than this cost the verify
# rows more than they save (bench/speculative.py's free-text task).
MIN_ACCEPT_RATE = 0.2
PAUSE_STEPS = 16
MAX_PAUSE_STEPS = 256
_SMOOTHING = 0.5
_DECAY = 0.8  # of the acceptance counts per verify step: a few steps' evidence


class NgramIndex:
    """One sequence's tokens, and where each of its n-grams (n in [min_window, max_window])
    last occurred: the position its continuation starts at. Both grow by the tokens
    appended since the last proposal, so a proposal costs the new tokens and one lookup
    per window size, whatever the sequence's length."""

    def __init__(self, min_window: int, max_window: int) -> None:
        self.windows = range(max_window, min_window - 1, -1)
        self.seen: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.windows}
        self.tokens: list[int] = []
        self.prompt_len = 0
        self.indexed = 0  # continuation starts registered so far: positions 1 .. indexed

    def _sync(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Takes in the tokens appended since, and registers every n-gram that ends before
        the last token (the tail's own n-grams wait, so a lookup of the tail finds an
        earlier occurrence)."""
        if not self.tokens:
            self.tokens.extend(prompt)
            self.prompt_len = len(prompt)
        self.tokens.extend(output[len(self.tokens) - self.prompt_len:])
        tokens = self.tokens
        for p in range(self.indexed + 1, len(tokens)):
            for n in self.windows:
                if p >= n:
                    self.seen[n][tuple(tokens[p - n:p])] = p
        self.indexed = max(self.indexed, len(tokens) - 1)

    def propose(self, prompt: Sequence[int], output: Sequence[int], k: int) -> list[int]:
        """k tokens that followed the most recent earlier occurrence of the last n tokens of
        prompt + output, for the largest n that occurred; [] if none did. `prompt` is the
        same at every call; `output` only grows."""
        return self.match(prompt, output, k)[1]

    def match(self, prompt: Sequence[int], output: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, the draft) of `propose`; (0, []) if nothing matched."""
        if k <= 0:
            return 0, []
        self._sync(prompt, output)
        tokens = self.tokens
        for n in self.windows:
            if len(tokens) > n:
                start = self.seen[n].get(tuple(tokens[len(tokens) - n:]))
                if start is not None:
                    # What followed, and where that reaches the tail, the same period again
                    # (a repeating run drafts as far as asked).
                    period = len(tokens) - start
                    return n, [tokens[start + i % period] for i in range(k)]
        return 0, []


@dataclasses.dataclass
class DraftBudget:
    """How many tokens one sequence drafts next, from how its drafts have done: one at
    first and after a pause, twice as many after a draft taken whole (up to max_tokens),
    as many as were taken after a draft taken in part. A failed draft of one costs a
    verify row; a failed draft of four, four (text that matches only by chance, as free
    chat does, pays the least)."""
    max_tokens: int
    size: int = 1       # the next draft's length, at most
    rate: float = 1.0   # moving average of the share of drafted tokens accepted
    paused: int = 0     # steps left without drafting
    pauses: int = 0     # pauses in a row (a draft accepted in full ends the run)
    # Drafts accepted and first rejections, decayed (draft_cost.py's acceptance), from an even prior.
    hits: float = 1.0
    misses: float = 1.0
    # Steps the cost left it without drafts (draft_cost.should_probe: from PAUSE_STEPS on, it
    # may probe; a fresh budget starts there, so its first ask is a probe).
    idle: int = PAUSE_STEPS - 1
    probes: int = 0     # probes in a row that did not pay

    def next_k(self) -> int:
        if self.paused > 0:
            self.paused -= 1
            if self.paused == 0:
                self.rate, self.size = MIN_ACCEPT_RATE * 2, 1  # probe again, gently
            return 0
        return min(self.max_tokens, self.size)

    @property
    def acceptance(self) -> float:
        """The chance that a draft token is accepted after the ones before it were."""
        return self.hits / (self.hits + self.misses)

    def after(self, proposed: int, accepted: int) -> "DraftBudget":
        """The budget once this step's draft is recorded and the next length asked, changing
        nothing (a draft model drafts for the next step at most its next_k())."""
        ahead = dataclasses.replace(self)
        ahead.record(proposed, accepted)
        return ahead

    def record(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.rate = (1 - _SMOOTHING) * self.rate + _SMOOTHING * accepted / proposed
        self.hits = _DECAY * self.hits + accepted
        self.misses = _DECAY * self.misses + (accepted < proposed)
        if accepted == proposed:
            self.pauses = 0
            self.size = min(self.max_tokens, 2 * proposed)
        else:
            self.size = max(1, accepted)
        if self.rate < MIN_ACCEPT_RATE:
            self.paused = min(MAX_PAUSE_STEPS, PAUSE_STEPS << self.pauses)
            self.pauses += 1

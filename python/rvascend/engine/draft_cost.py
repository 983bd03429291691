"""The draft length chosen by cost (`--speculative-step-costs`): each step, how many tokens
each decoding sequence drafts, from what the passes cost and how each sequence's drafts
have been accepted, so that speculation is never expected to be slower than decoding.

A sequence's drafts are modelled as accepted token by token with one probability a (its
acceptance, learned from its verify steps: DraftBudget.acceptance): k drafts give
1 + a + ... + a^k tokens on average. A step costs the target's pass over its rows and,
for a draft model, the draft's passes (one over the positions the step kept plus the
drawn token, then one per further draft). Pass costs come from a table by row count:
learned on this machine from the passes run (`measured`), or given (the board's counted
instructions, bench/speculative.py's K1 projection).

The step's lengths: the m sequences with the best acceptance draft up to k tokens each
(their own budget's cap and room), for the (k, m) of most expected tokens per second;
nobody drafts unless that beats decoding by MARGIN. With a draft model a sequence that
drafts nothing skips the draft's passes too (standalone_draft.py catches its positions
up before it drafts again).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import time
from typing import Optional, Sequence

from rvascend.engine.ngram_draft import MAX_PAUSE_STEPS, PAUSE_STEPS

# Drafting must beat decoding's expected tokens per second by this much: the model's own
# error (noise in measured costs, acceptance that is not token by token) is no reason to draft.
MARGIN = 1.03
# A probe's catch-up (a draft model's pass over the positions it skipped) may cost at most
# this share of the target's steps it skipped.
PROBE_SHARE = 0.03
# Measured costs: a moving average per row count; only row counts up to this are kept.
_SMOOTHING = 0.2
_OUTLIER = 3.0  # a measured pass counts as at most this many times the average so far
_FIRST = 1.5     # a new row count's first pass, as at most this many times what was expected
_MAX_ROWS = 4096
COST_MODELS = ("measured", "none")


def _averaged(old: float, seconds: float) -> float:
    """The moving average after a measurement, one held up by something else (another process,
    a collection) counted as at most _OUTLIER times the average so far."""
    return old + _SMOOTHING * (min(seconds, _OUTLIER * old) - old)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a verify step of k drafts gives on average (its own sampled token included)."""
    a = min(max(acceptance, 0.0), 1.0)
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


class PassCosts:
    """Seconds (or any one unit) a model's forward pass takes by its row count: given, or a
    moving average per count measured. Counts never seen: between two known, on the line
    through them; beyond the last, on the last segment's line, never falling; flat with
    one known or below the first. A pass of more rows never costs less than one of fewer
    (measured counts mix passes timed at start with whole steps timed since)."""

    def __init__(self, table: Optional[dict[int, float]] = None) -> None:
        self.fixed = table is not None
        self.table: dict[int, float] = dict(table or {})
        if any(r < 1 or not math.isfinite(t) or t < 0 for r, t in self.table.items()):
            raise ValueError(f"pass costs need row counts >= 1 and finite costs >= 0, not {self.table}")
        self._rows = sorted(self.table)
        self._floor: Optional[list[float]] = None  # per known count, the most any count up to it costs

    def add(self, rows: int, seconds: float) -> None:
        if self.fixed or not 1 <= rows <= _MAX_ROWS or not seconds >= 0:
            return
        old = self.table.get(rows)
        if old is None:
            self.set(rows, seconds)
        else:
            self.table[rows] = _averaged(old, seconds)
            self._floor = None

    def set(self, rows: int, seconds: float) -> None:
        if rows not in self.table:
            bisect.insort(self._rows, rows)
        self.table[rows] = seconds
        self._floor = None

    @property
    def known(self) -> bool:
        return bool(self._rows)

    @property
    def slope(self) -> Optional[float]:
        """What a further row costs, from the first known count to the last (None: fewer than two)."""
        known = self._rows
        if len(known) < 2:
            return None
        return max(0.0, (self.table[known[-1]] - self.table[known[0]]) / (known[-1] - known[0]))

    def __call__(self, rows: int) -> float:
        known = self._rows
        if not known:
            return 0.0
        if self._floor is None:
            self._floor = list(itertools.accumulate((self.table[r] for r in known), max))
        at = bisect.bisect_right(known, rows) - 1
        return max(self._line(rows), self._floor[at]) if at >= 0 else self._line(rows)

    def _line(self, rows: int) -> float:
        t = self.table.get(rows)
        if t is not None:
            return t
        known = self._rows
        if len(known) == 1 or rows < known[0]:
            return self.table[known[0]]
        i = min(bisect.bisect_left(known, rows), len(known) - 1)
        r0, r1 = known[i - 1], known[i]
        t0, t1 = self.table[r0], self.table[r1]
        if rows < r1:
            return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
        return t1 + max(0.0, (t1 - t0) / (r1 - r0)) * (rows - r1)  # beyond: never cheaper with more rows


class StepCosts:
    """The target's and the draft model's pass costs, a table by row count per number of
    sequences in the pass (several sequences' rows cost more than one's: attention and the
    verify path run per sequence). Given tables are one sequence's (the board's counts)."""

    def __init__(self, target: Optional[dict[int, float]] = None, draft: Optional[dict[int, float]] = None) -> None:
        self.target: dict[int, PassCosts] = {1: PassCosts(target)}
        self.draft: dict[int, PassCosts] = {1: PassCosts(draft)}
        # A drafting step's draft-model work beside its passes (batches, slots; measured only).
        self.overhead = 0.0
        self._overhead_seen = False

    def add(self, tables: dict[int, PassCosts], sequences: int, rows: int, seconds: float) -> None:
        if tables[1].fixed:
            return
        table = tables.setdefault(sequences, PassCosts())
        if rows not in table.table:
            # A new count's first pass counts as at most _FIRST times what was expected of it: a
            # first pass held up would make every larger count look dear, and those are then never
            # run to be measured again; one that costs more than expected shows in the next ones.
            expected = self.cost(tables, sequences, rows)
            if expected > 0:
                seconds = min(seconds, _FIRST * expected)
        table.add(rows, seconds)

    def add_overhead(self, seconds: float) -> None:
        if self.draft[1].fixed or not seconds >= 0:
            return
        self.overhead = _averaged(self.overhead, seconds) if self._overhead_seen else seconds
        self._overhead_seen = True

    def known(self) -> bool:
        return any(t.known for t in self.target.values())

    @staticmethod
    def cost(tables: dict[int, PassCosts], sequences: int, rows: int) -> float:
        """A pass of `rows` rows over `sequences` sequences. With that many sequences
        measured: off its table, past a lone measured count (a decode step) each further
        row as one sequence's further rows cost (what the step then measures corrects it);
        with none, as that many one-sequence passes."""
        table, one = tables.get(sequences), tables[1]
        if table is not None and table.known and table is not one and len(table.table) == 1:
            (r0, t0), = table.table.items()
            slope = one.slope
            return t0 + (t0 / r0 if slope is None else slope) * max(0, rows - r0)
        if table is not None and table.known:
            return table(rows)
        return sequences * one(max(1, -(-rows // sequences))) if one.known else 0.0

    def step(self, sequences: int, rows: int, drafting: Sequence[int], model_drafted: bool) -> float:
        """A step of `sequences` sequences and `rows` target rows in which sequences draft
        `drafting` tokens each (> 0) for a model-drafted algorithm: the draft's first pass
        runs each drafting sequence's kept positions (about its expected tokens: one for a
        decode step's input, counted with its drawn token as two) and later passes one row
        per sequence still drafting."""
        cost = self.cost(self.target, sequences, rows)
        if model_drafted and drafting:
            cost += self.overhead + self.cost(self.draft, len(drafting), 2 * len(drafting))
            going = collections.Counter(drafting)
            left = len(drafting)
            for j in range(1, max(drafting)):  # pass j + 1 runs the sequences drafting more than j
                left -= going[j]
                cost += self.cost(self.draft, left, left)
        return cost


def choose_lengths(acceptance: Sequence[float], caps: Sequence[int], costs: StepCosts, sequences: int,
                   batch_rows: int, model_drafted: bool) -> list[int]:
    """Each candidate's draft length (0 .. its cap) for a step of `sequences` decoding
    sequences whose target pass has `batch_rows` rows without drafts (prompt chunks'
    included): the (k, m) with most expected tokens per unit of cost, all zero unless that
    beats decoding by MARGIN. With no cost known yet (a hybrid target's first step), as asked."""
    n = len(caps)
    lengths = [0] * n
    if not n or not costs.known():
        return [max(0, c) for c in caps]
    order = sorted(range(n), key=lambda i: -acceptance[i])
    base_tokens = float(sequences)
    best = base_tokens / max(costs.step(sequences, batch_rows, [], model_drafted), 1e-12) * MARGIN
    choice: Optional[tuple[int, int]] = None
    # m in 1, 2, 4, ... and n: K log n step costs of O(K) each, a few ms at 64 x 16.
    tried = sorted({1 << b for b in range(n.bit_length())} | {n})
    for k in range(1, max(caps, default=0) + 1):
        tokens, extra, drafting = base_tokens, 0, []
        for m, i in enumerate(order, start=1):
            d = min(k, caps[i])
            if d > 0:
                tokens += expected_tokens(acceptance[i], d) - 1.0
                extra += d
                drafting.append(d)
            if m not in tried or not drafting:
                continue
            rate = tokens / max(costs.step(sequences, batch_rows + extra, drafting, model_drafted), 1e-12)
            if rate > best:
                best, choice = rate, (k, m)
    if choice is not None:
        k, m = choice
        for i in order[:m]:
            lengths[i] = max(0, min(k, caps[i]))
    return lengths


def should_probe(budget, behind: int, costs: StepCosts, sequences: int) -> bool:
    """Whether a sequence the cost has left without drafts for `budget.idle` steps drafts
    once anyway, or neither its acceptance nor those rows' costs would be seen to change:
    at the first ask (a fresh budget's idle starts there), then after PAUSE_STEPS, twice as
    long after each probe that did not pay (at most MAX_PAUSE_STEPS), and only where the
    positions a draft model must first catch up (`behind`) cost at most PROBE_SHARE of
    the sequence's share of the target steps it skipped."""
    if budget.idle < min(MAX_PAUSE_STEPS, PAUSE_STEPS << budget.probes):
        return False
    catch_up = costs.cost(costs.draft, 1, behind + 2) - costs.cost(costs.draft, 1, 2) if behind > 0 else 0.0
    return catch_up <= PROBE_SHARE * budget.idle * costs.cost(costs.target, sequences, sequences) / sequences


def calibrate(costs: PassCosts, model, pool, max_rows: int, context: int = 64, runs: int = 2) -> None:
    """Measures `model`'s pass of one sequence of 1, 2 and max_rows rows after `context`
    positions into `costs` (the fastest of `runs` after a warm-up: the machine's cost, not
    what else ran; the counts between are on their line), the costs a fresh engine starts
    from, so its first steps do not draft blind. Writes slots 0 .. context + max_rows - 1
    of `pool`, free when an engine starts."""
    import torch

    from rvascend.models.decoder import ForwardBatch

    if costs.fixed or pool.num_slots < context + max_rows:
        return
    slots = torch.arange(context + max_rows, dtype=torch.long)
    with torch.inference_mode():
        for rows in sorted({1, min(2, max_rows), max_rows}):
            batch = ForwardBatch(torch.zeros(rows, dtype=torch.long), torch.arange(context, context + rows),
                                 [rows], [context], [slots[:context + rows]], slots[context:context + rows])
            times = []
            for _ in range(1 + runs):
                started = time.perf_counter()
                model(batch, pool)
                times.append(time.perf_counter() - started)
            costs.set(rows, min(times[1:]))


def parse_cost_model(spec: str) -> Optional[StepCosts]:
    """`--speculative-step-costs`: "measured" (learned here) or "none" (every sequence drafts
    what its budget asks, whatever the cost)."""
    if spec not in COST_MODELS:
        raise ValueError(f"--speculative-step-costs {spec!r}: expected one of {', '.join(COST_MODELS)}")
    return StepCosts() if spec == "measured" else None

"""The draft length chosen by cost: expected tokens, pass costs by row count (given and
measured), the lengths a step's sequences get (none unless drafting beats decoding), and
the probes that let a sequence the cost left without drafts draft again."""

from __future__ import annotations

import pytest

from rvascend.engine.draft_cost import (MARGIN, PassCosts, StepCosts, choose_lengths, expected_tokens, parse_cost_model,
                                        should_probe)
from rvascend.engine.ngram_draft import MAX_PAUSE_STEPS, PAUSE_STEPS, DraftBudget
from rvascend.engine.speculation import Speculator


def test_expected_tokens():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.8, 0) == pytest.approx(1.0)


def test_pass_costs_read_unseen_row_counts_off_the_nearest_line():
    costs = PassCosts({1: 1.0, 3: 2.0, 9: 2.6})
    assert costs(3) == 2.0
    assert costs(2) == pytest.approx(1.5)
    assert costs(6) == pytest.approx(2.3)
    assert costs(13) == pytest.approx(3.0)    # beyond the last: the last segment's slope
    costs.add(2, 9.0)                         # a given table is not measured over
    assert costs(2) == pytest.approx(1.5)
    assert PassCosts({2: 0.5})(7) == 0.5      # one known count: flat
    assert PassCosts({1: 2.0, 2: 1.0})(5) == 2.0  # more rows never cost less than fewer
    assert PassCosts({1: 2.0, 2: 1.0})(2) == 2.0
    assert PassCosts({1: 1.0, 4: 5.0, 5: 3.0})(8) == 5.0  # a whole step at 4 rows, a bare pass at 5
    with pytest.raises(ValueError, match="row counts >= 1"):
        PassCosts({0: 1.0})


def test_measured_costs_are_a_moving_average_per_row_count():
    costs = PassCosts()
    assert not costs.known and costs(4) == 0.0
    costs.add(1, 1.0)
    for _ in range(50):
        costs.add(1, 2.0)
    costs.add(5, 3.0)
    costs.add(0, 100.0)  # not a pass
    assert costs(1) == pytest.approx(2.0, abs=1e-3)
    assert costs(3) == pytest.approx(2.5, abs=1e-3)
    costs.add(1, 1000.0)  # held up by something else: counts as three times the average at most
    assert costs(1) == pytest.approx(2.0 + 0.2 * 4.0, abs=1e-3)
    costs.set(7, 9.0)  # a calibrated pass: kept as it is
    assert costs(7) == 9.0


def test_nothing_known_drafts_as_asked():
    assert choose_lengths([0.1, 0.9], [3, 2], StepCosts(), 2, 2, True) == [3, 2]


def test_cheap_verify_rows_draft_in_full():
    costs = StepCosts(target={1: 1.0, 5: 1.04})  # NGRAM: no draft passes
    assert choose_lengths([0.9], [4], costs, 1, 1, False) == [4]


def test_a_draft_model_as_costly_as_the_target_never_drafts():
    flat = {r: 1.0 for r in range(1, 10)}
    costs = StepCosts(target=flat, draft=flat)
    assert choose_lengths([0.6, 0.8], [4, 4], costs, 2, 2, True) == [0, 0]
    # Nearly free drafts at the same acceptance: both draft, in full.
    cheap = StepCosts(target=flat, draft={1: 0.01, 8: 0.02})
    assert choose_lengths([0.6, 0.8], [4, 4], cheap, 2, 2, True) == [4, 4]


def test_only_the_sequences_whose_drafts_pay_draft():
    # Each verify row costs a fifth of a decode step: a poor acceptance does not pay for its rows.
    costs = StepCosts(target={1: 1.0, 2: 1.2})
    assert choose_lengths([0.05, 0.95], [4, 4], costs, 2, 2, False) == [0, 4]


def test_several_sequences_cost_what_was_measured_for_as_many():
    costs = StepCosts()
    costs.target[1].set(1, 1.0)  # calibrated: one sequence
    costs.target[1].set(2, 1.1)
    assert costs.cost(costs.target, 4, 8) == pytest.approx(4 * 1.1)  # unmeasured: four one-sequence passes
    costs.add(costs.target, 4, 4, 3.0)                                 # a decode step of four
    assert costs.cost(costs.target, 4, 6) == pytest.approx(3.2)        # further rows as one sequence's
    costs.add(costs.target, 4, 8, 4.0)
    assert costs.cost(costs.target, 4, 6) == pytest.approx(3.5)        # two counts measured: their line
    assert costs.cost(costs.target, 1, 2) == pytest.approx(1.1)        # (given tables are not measured over)
    board = StepCosts(target={1: 1.0})
    board.add(board.target, 4, 4, 9.0)
    assert 4 not in board.target


def test_a_draft_models_work_beside_its_passes_counts():
    costs = StepCosts()
    costs.target[1].set(1, 1.0)
    costs.target[1].set(2, 1.0)
    costs.draft[1].set(1, 0.1)
    costs.draft[1].set(2, 0.1)
    assert choose_lengths([0.5], [1], costs, 1, 1, True) == [1]   # 1.5 tokens for 1.1
    costs.add_overhead(0.5)                                         # and half a step more each time
    assert costs.overhead == 0.5
    costs.add_overhead(100.0)                                       # held up: three times the average at most
    assert costs.overhead == pytest.approx(0.5 + 0.2 * 1.0)
    assert choose_lengths([0.5], [1], costs, 1, 1, True) == [0]   # 1.5 tokens for 1.6
    assert costs.step(1, 1, [], True) == 1.0                        # decoding alone pays none of it


def test_a_slow_first_pass_at_a_new_count_does_not_stop_drafting_for_good():
    costs = StepCosts()
    for rows in range(1, 6):
        costs.target[1].set(rows, 0.010 + 0.0005 * rows)
    costs.add(costs.target, 4, 4, 0.020)
    assert choose_lengths([0.9] * 4, [4] * 4, costs, 4, 4, False) == [4] * 4
    costs.add(costs.target, 4, 8, 0.060)  # held up three times over: counted as 1.5x the 0.022 expected
    assert costs.cost(costs.target, 4, 8) == pytest.approx(1.5 * 0.022)
    assert all(choose_lengths([0.9] * 4, [4] * 4, costs, 4, 4, False))  # still drafting: measured again


def test_a_gain_under_the_margin_drafts_nothing():
    # One draft at acceptance a gives 1 + a tokens for the verify step's cost.
    a = 0.3
    costs = StepCosts(target={1: 1.0, 2: (1 + a) / MARGIN * 1.001})
    assert choose_lengths([a], [1], costs, 1, 1, False) == [0]
    costs = StepCosts(target={1: 1.0, 2: (1 + a) / MARGIN * 0.99})
    assert choose_lengths([a], [1], costs, 1, 1, False) == [1]


def test_acceptance_is_learned_from_verify_steps():
    budget = DraftBudget(4)
    assert budget.acceptance == 0.5
    for _ in range(20):
        budget.record(4, 4)
    assert budget.acceptance > 0.95
    for _ in range(20):
        budget.record(4, 0)
    assert budget.acceptance < 0.05
    ahead = budget.after(4, 4)  # what next step's choice sees; the budget itself unchanged
    assert ahead.acceptance > budget.acceptance and budget.hits == pytest.approx(ahead.hits - 4, rel=0.3)


def test_a_sequence_left_without_drafts_probes_ever_less_often():
    flat = {r: 1.0 for r in range(1, 10)}
    spec = Speculator("NGRAM", 4, 2, 8, False, "llama", costs=StepCosts(target=flat, draft=flat))
    spec.costs.target[1] = PassCosts({1: 1.0, 2: 3.0})  # a verify row costs two decode steps: never pays
    budget = DraftBudget(4)
    probes = [i for i in range(1, 16 * PAUSE_STEPS) if spec.lengths([budget], [0.9], [3], 1, 1) == [3]]
    gaps = [b - a for a, b in zip([0] + probes, probes)]
    assert gaps[:4] == [1, 2 * PAUSE_STEPS, 4 * PAUSE_STEPS, 8 * PAUSE_STEPS]  # the first ask probes
    assert max(gaps) <= MAX_PAUSE_STEPS
    spec.costs.target[1] = PassCosts({1: 1.0, 2: 1.0})  # now free: it drafts, and the probes start over
    assert spec.lengths([budget], [0.9], [4], 1, 1) == [4]  # (probes: what it asks)
    assert budget.probes == 0 and budget.idle == 0


def test_a_probe_whose_catch_up_costs_too_much_is_not_made():
    # A draft pass costs 1 plus 0.1 a row; the target's step 10 for two sequences (two of one's).
    costs = StepCosts(target={1: 5.0}, draft={1: 1.0, 2: 1.1})
    budget = DraftBudget(4, idle=PAUSE_STEPS)
    # 16 skipped steps: the sequence's share is 80; 3 % of it pays for 24 rows of catch-up.
    assert should_probe(budget, 23, costs, 2)
    assert not should_probe(budget, 25, costs, 2)
    assert should_probe(budget, 0, StepCosts(target={1: 1.0}, draft={1: 100.0, 2: 200.0}), 1)  # nothing to catch up
    assert not should_probe(DraftBudget(4, idle=PAUSE_STEPS - 1), 0, costs, 2)


def test_the_flag_names_its_choices():
    assert parse_cost_model("none") is None
    assert isinstance(parse_cost_model("measured"), StepCosts)
    with pytest.raises(ValueError, match="measured, none"):
        parse_cost_model("board")

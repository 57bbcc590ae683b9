"""The batch's goodput policy on hand-built cost curves (no timing)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from helpers import Curve
from quickdraft.batch.policy import GoodputPolicy, Realized
from quickdraft.costs import LEVEL_DECAY, STALL, MeasuredCosts, RowOutlook, expected_tokens, step_cost, step_tokens
from quickdraft.policy import LOSS_BUDGET, LOSS_SLACK, Decision, LossBudget


def k_and_probing(decision: Decision) -> tuple[int, bool]:
    return decision.k, decision.probing


def rows(count: int, acceptance: float, cap: int = 5, model: bool = True) -> list[RowOutlook]:
    return [RowOutlook(cap=cap, acceptance=acceptance, model=model) for _ in range(count)]


def test_flat_verification_cost_drafts_the_full_k():
    policy = GoodputPolicy(5, Curve(verify=lambda positions: 1.0))
    assert policy.decide(rows(4, 0.7, model=False)).k == 5


def test_cost_linear_in_positions_does_not_draft():
    # Every position costs as much as a plain row's: a draft can only lose (E(k) < k + 1).
    policy = GoodputPolicy(5, Curve(verify=lambda positions: 0.1 * positions), probe_every=1000)
    assert policy.decide(rows(8, 0.9, model=False)).k == 0


def test_the_batch_size_turns_speculation_off_where_compute_saturates():
    # Free up to 16 positions, linear beyond (a machine whose matrix units fill at 16 positions).
    saturating = Curve(verify=lambda positions: max(1.0, positions / 16), draft=lambda rows: 0.05)
    policy = GoodputPolicy(5, saturating, probe_every=1000)
    assert policy.decide(rows(2, 0.8)).k >= 3
    assert policy.decide(rows(16, 0.8)).k == 0


def test_rows_still_reading_their_prompts_count_as_the_batch_it_is_about_to_be():
    # The first 4 rows of 16 that joined together decode while 12 still prefill: drafting pays
    # at 4 rows, not at the 16 the batch grows to next step.
    saturating = Curve(verify=lambda positions: max(1.0, positions / 16), draft=lambda rows: 0.05)
    policy = GoodputPolicy(5, saturating, probe_every=1000)
    assert policy.decide(rows(4, 0.8)).k >= 3
    decision = policy.decide(rows(4, 0.8), joining=12)
    assert decision.k == 0 and decision.drafts == (0,) * 4  # one per decoding row
    assert policy.decide(rows(4, 0.8), joining=1).k > 0  # 5 rows: drafting still pays


def test_the_choice_maximises_tokens_per_second_and_is_never_below_plain():
    curve = Curve(verify=lambda positions: 1.0 + 0.02 * positions, draft=lambda rows: 0.1)
    batch = rows(6, 0.6)
    policy = GoodputPolicy(5, curve, probe_every=1000)
    k = policy.decide(batch).k
    rate = {j: step_tokens(batch, j) / step_cost(batch, j, curve) for j in range(6)}
    assert rate[k] == max(rate.values()) and rate[k] >= rate[0]


def test_rows_that_cannot_draft_are_not_counted_as_drafting():
    # Prompt lookup found nothing (cap 0) in every row: nothing to draft whatever the costs.
    assert GoodputPolicy(5, Curve(verify=lambda positions: 1.0)).decide(rows(4, 0.9, cap=0, model=False)).k == 0


def test_a_seeded_rows_fixed_k_sets_the_width_the_others_pay_for():
    batch = [RowOutlook(cap=5, acceptance=0.0, model=False, fixed=5)] + rows(3, 0.0, model=False)
    curve = Curve(verify=lambda positions: float(positions))
    assert step_cost(batch, 0, curve) == 4 * 6  # four rows padded to the fixed row's 1 + 5
    assert step_tokens(batch, 0) == 4.0


def test_a_ragged_verification_charges_each_row_its_own_positions():
    """Two of 16 rows can draft (lookup copies, well accepted): padded, every row would be
    verified over 1 + k positions and drafting loses; where the target's forward skips padding
    (``ragged``) the two rows pay for their own positions and draft."""
    batch = rows(2, 0.9, model=False) + rows(14, 0.9, cap=0, model=False)
    curve = Curve(verify=lambda positions: 1.0 + 0.05 * positions)
    assert step_cost(batch, 4, curve) == pytest.approx(1.0 + 0.05 * 16 * 5)
    assert step_cost(batch, 4, curve, ragged=True) == pytest.approx(1.0 + 0.05 * (16 + 2 * 4))
    padded, ragged = GoodputPolicy(5, curve, probe_every=1000), GoodputPolicy(5, curve, probe_every=1000)
    assert padded.decide(batch).k == 0
    decision = ragged.decide(batch, ragged=True)
    assert decision.k >= 3 and decision.drafts[:2] == (decision.k,) * 2 and decision.drafts[2:] == (0,) * 14


def test_a_draft_forward_is_priced_over_the_rows_that_draft_with_the_model():
    # Of 5 rows, 2 draft with the model, 1 copies a prompt-lookup draft, 1 is kept from drafting
    # (cap 0) and 1 drafts nothing: each of the 3 draft forwards runs over the 2 model rows.
    batch = rows(2, 0.8) + rows(1, 0.8, model=False) + rows(1, 0.8, cap=0) + rows(1, 0.8, cap=0, model=False)
    curve = Curve(verify=lambda positions: 1.0, draft=lambda rows: 0.01 * rows)
    assert step_cost(batch, 3, curve) == pytest.approx(1.0 + 3 * 0.02)
    assert step_cost(rows(1, 0.8, model=False) + rows(4, 0.8, cap=0), 3, curve) == pytest.approx(1.0)  # lookup only


def test_measured_costs_start_with_plain_steps_then_try_drafting():
    policy = GoodputPolicy(4)
    batch = rows(3, 0.8, model=False)
    assert policy.decide(batch).k == 0  # nothing measured: the baseline first
    policy.observe_timings(positions=3, verify_seconds=1.0, rows=3, draft_forwards=0, draft_seconds=0.0)
    assert policy.decide(batch).k == 4  # one point: the curve is taken as flat until measured
    policy.observe_timings(positions=15, verify_seconds=10.0, rows=3, draft_forwards=0, draft_seconds=0.0)
    assert policy.decide(batch).k == 0  # 5 positions a row cost 10x one: not worth it


def test_the_first_draft_forward_is_a_probe_of_one_row():
    policy = GoodputPolicy(4, probe_every=1000)
    batch = rows(16, 0.8)
    assert policy.decide(batch).k == 0  # the baseline first
    policy.observe_timings(positions=16, verify_seconds=0.25, rows=16, draft_forwards=0, draft_seconds=0.0)
    # No draft forward timed: one row drafts one token, not all 16 reading their prompts.
    assert k_and_probing(policy.decide(batch)) == (1, True)
    policy.observe_timings(positions=32, verify_seconds=0.26, rows=1, draft_forwards=1, draft_seconds=0.02)
    assert k_and_probing(policy.decide(batch)) == (4, False)


# A step costs 1 + 0.05 per position: 8 rows drafting k = 1 pay when most drafts are accepted.
AFFINE = Curve(verify=lambda positions: 1.0 + 0.05 * positions)


def test_a_long_run_without_drafts_probes_one_token():
    # Acceptance 0.3: k = 1 expected at 1.01x plain, short of the margin but near paying.
    policy = GoodputPolicy(5, AFFINE, probe_every=4, probe_share=1.0)
    choices = [policy.decide(rows(8, 0.3, model=False)).k for _ in range(8)]
    assert choices == [0, 0, 0, 1, 0, 0, 0, 1]


def test_no_probe_while_rows_join():
    # A probe falls due at the 4th step; rows join then for two steps (the batch is about to
    # widen), and it comes on the first step after them.
    policy = GoodputPolicy(5, AFFINE, probe_every=4, probe_share=1.0)
    joining = [0, 0, 0, 2, 1, 0, 0]
    choices = [policy.decide(rows(8, 0.3, model=False), joining=j).k for j in joining]
    assert choices == [0, 0, 0, 0, 0, 1, 0]


def test_no_probe_while_the_batch_is_narrower_than_in_its_last_steps():
    # Each position costs about a row's: drafting does not pay at 8 rows or at 2 (acceptance
    # 0.3), accepted drafts would. A probe falls due at the 4th step, where the batch has
    # narrowed from 8 rows to 2 (a wave's first request, the rest not yet arrived): it waits
    # until the batch has been 2 rows wide for the 4 steps the policy looks back over
    # (``probe_every``). The control, 2 rows all along, probes when the probe falls due.
    steep = Curve(verify=lambda positions: 0.1 + 0.1 * positions)

    def probes(widths: list[int]) -> list[int]:
        policy = GoodputPolicy(5, steep, probe_every=4, probe_share=1.0)
        return [i for i, width in enumerate(widths) if policy.decide(rows(width, 0.3, model=False)).k]

    assert probes([8, 8, 8] + [2] * 6) == [7]
    assert probes([2] * 9) == [3]


def test_probes_that_find_nothing_come_less_and_less_often():
    # Drafts rarely accepted (k = 1 at 0.86x plain): not near paying, though all-accepted drafts would.
    policy = GoodputPolicy(5, AFFINE, probe_every=2, max_probe_every=8, probe_share=1.0)
    choices = [policy.decide(rows(8, 0.1, model=False)).k for _ in range(2 + 4 + 8 + 8)]
    assert [i for i, k in enumerate(choices) if k] == [1, 5, 13, 21]


def test_probes_take_at_most_their_share_of_the_time():
    # A probe widens 8 rows' verification to 16 positions: 0.4 s over a plain step of 1.4 s,
    # 0.29 steps; at 2% of the time, the next comes 15 steps after it (not 2, 4, 8).
    policy = GoodputPolicy(5, AFFINE, probe_every=2, max_probe_every=8, probe_share=0.02)
    choices = [policy.decide(rows(8, 0.1, model=False)).k for _ in range(40)]
    assert [i for i, k in enumerate(choices) if k] == [1, 16, 31]


def test_probes_are_spaced_by_what_they_cost_as_measured():
    # The probes above, but the first one's step measured 2.8 s (a catch-up of 0.4 s, a
    # verification of 2.4 s): a plain step more than a plain step, where the estimate said 0.29
    # of one. At 2% of the time the next waits 50 steps, not 15.
    policy = GoodputPolicy(5, AFFINE, probe_every=2, max_probe_every=8, probe_share=0.02)
    choices = []
    for _ in range(60):
        decision = policy.decide(rows(8, 0.1, model=False))
        choices.append(decision.k)
        if decision.probing:
            policy.observe_catch_up(positions=40, seconds=0.4)
            policy.observe_timings(positions=16, verify_seconds=2.4, rows=0, draft_forwards=0, draft_seconds=0.0)
    assert [i for i, k in enumerate(choices) if k] == [1, 51]


def test_a_probe_costs_its_rows_widening_and_the_draft_models_least_catch_up():
    curve = Curve(verify=lambda positions: 1.0 + 0.05 * positions, draft=lambda rows: 0.1 * rows)
    policy = GoodputPolicy(5, curve, probe_every=1, probe_share=0.1)
    # 4 rows: 0.2 s wider verification, one row's draft forward 0.1 s, and its catch-up of 20
    # positions at the draft's cost ratio over one row (0.1 / 1.05): 2.0 x 0.1 / 1.05.
    behind = [RowOutlook(cap=5, acceptance=0.0, model=True, behind=b) for b in (40, 20, 60, 30)]
    assert policy.probe_cost(behind) == pytest.approx(0.2 + 0.1 + 2.0 * 0.1 / 1.05)


def test_the_draft_models_first_drafts_are_a_probe_while_its_acceptance_is_the_prior():
    curve = Curve(verify=lambda positions: 1.0, draft=lambda rows: 0.01)
    fresh = [RowOutlook(cap=4, acceptance=0.5, model=True, prior=True) for _ in range(8)]
    policy = GoodputPolicy(4, curve)
    assert k_and_probing(policy.decide(fresh)) == (1, True)
    measured = [replace(row, prior=False) for row in fresh]
    assert k_and_probing(policy.decide(measured)) == (4, False)


def test_no_probe_where_even_accepted_drafts_would_not_pay():
    # Linear in positions: k + 1 tokens a row cost k + 1 steps, whatever the acceptance.
    policy = GoodputPolicy(5, Curve(verify=lambda positions: 0.1 * positions), probe_every=2)
    assert [policy.decide(rows(8, 0.9, model=False)).k for _ in range(10)] == [0] * 10


def test_the_rows_that_draft_are_those_least_behind_that_pay_best():
    # Verification flat (1 s) up to 32 positions; a draft forward 0.1 s, a catch-up 0.01 s a
    # position. 4 rows 200 tokens behind with 4 tokens left: catching them up costs more than
    # drafting gains (judged on all 8 rows, drafting does not pay); the 4 rows just joined
    # (5 behind, 60 tokens left) draft alone.
    curve = Curve(verify=lambda positions: max(1.0, positions / 32), draft=lambda rows: 0.1,
                  catch_up=lambda positions: 0.01 * positions)
    policy = GoodputPolicy(3, curve, probe_every=1000)
    old = [RowOutlook(cap=3, acceptance=0.8, model=True, behind=200, remaining=4) for _ in range(4)]
    new = [RowOutlook(cap=3, acceptance=0.8, model=True, behind=5, remaining=60) for _ in range(4)]
    every = old + new
    plain = step_tokens(every, 0) / step_cost(every, 0, curve)
    assert all(step_tokens(every, k) / step_cost(every, k, curve) < plain for k in (1, 2, 3))
    assert policy.decide(old + new).drafts == (0,) * 4 + (3,) * 4


def test_rows_behind_draft_only_while_their_catch_up_fits_the_budget():
    # Verification flat (1 s) up to 64 positions, then linear; a draft forward a tenth of the
    # target's: a budget of half a plain step reads 320 positions.
    curve = Curve(verify=lambda positions: max(1.0, positions / 64), draft=lambda rows: 0.1)
    policy = GoodputPolicy(2, curve, probe_every=1000, catch_up_budget=0.5)
    batch = [RowOutlook(cap=2, acceptance=0.9, model=True, behind=b, remaining=1000) for b in (0, 150, 100, 200, 900)]
    batch.append(RowOutlook(cap=2, acceptance=0.9, model=False))  # a prompt-lookup copy
    batch.append(RowOutlook(cap=2, acceptance=0.9, model=True, behind=7, fixed=2))  # seeded: always drafts
    # Caught up, the lookup copy and the seeded row draft; of the rows behind, 100 then 150
    # positions fit, 200 more do not.
    assert policy.decide(batch).drafts == (2, 2, 2, 0, 0, 2, 2)
    # The least behind always may, however far behind it is.
    far = [RowOutlook(cap=2, acceptance=0.9, model=True, behind=b, remaining=1000) for b in (900, 500)]
    assert policy.decide(far).drafts == (0, 2)


def test_lookup_copies_let_no_probe_of_a_draft_model_that_could_not_pay():
    # 32 rows: 8 draft with the model, 24 have prompt-lookup copies of 3 tokens accepted 10% of
    # the time. Positions cost 0.02 s each beyond a step of 0.5 s, a draft forward 0.2 s: with
    # every copy counted as accepted, k = 3 makes 32 + 96 tokens in 3.66 s (35 tok/s against
    # 32 in 1.14 s, 28); with copies at their acceptance, at most 8 x 2 + 24 x 1.1 tokens in
    # 1.98 s (k = 1, 21 tok/s). A probe would measure the draft model, which cannot pay.
    curve = Curve(verify=lambda positions: 0.5 + 0.02 * positions, draft=lambda rows: 0.2)
    batch = rows(8, 0.9, cap=3) + [RowOutlook(cap=3, acceptance=0.1, model=False) for _ in range(24)]
    policy = GoodputPolicy(3, curve, probe_every=1, probe_share=1.0)
    for _ in range(4):
        assert k_and_probing(policy.decide(batch, ragged=True)) == (0, False)
    # Where prompt lookup is the only source, its copies are what a probe measures.
    lookup_only = [RowOutlook(cap=3, acceptance=0.1, model=False) for _ in range(32)]
    probes = [policy.decide(lookup_only, ragged=True).probing for _ in range(4)]
    assert any(probes)
    # So too where the only rows of the draft model are seeded (their k fixed): a probe drafts
    # no other row with it, and measures the copies.
    seeded = [RowOutlook(cap=3, acceptance=0.9, model=True, fixed=3) for _ in range(8)]
    policy = GoodputPolicy(3, curve, probe_every=1, probe_share=1.0)
    assert any(policy.decide(seeded + lookup_only[:24], ragged=True).probing for _ in range(4))


@pytest.mark.parametrize("behind, drafts", [
    ((30, 10, 20), [0, 1, 0, 1]),  # every row behind: the one least behind
    ((0, 20, 0), [1, 0, 1, 1]),  # every row the draft model is not behind on
], ids=["least-behind", "not-behind"])
def test_a_probe_drafts_with_the_rows_least_behind(behind, drafts):
    # Three rows drafting with the draft model, then a prompt-lookup copy (drafts in any probe).
    policy = GoodputPolicy(4, AFFINE, probe_every=1, probe_share=1.0)
    batch = [RowOutlook(cap=4, acceptance=0.1, model=True, behind=b) for b in behind]
    batch.append(RowOutlook(cap=3, acceptance=0.1, model=False))
    decision = policy.decide(batch)
    assert k_and_probing(decision) == (1, True) and list(decision.drafts) == drafts


def test_a_catch_up_costs_a_draft_forward_over_as_many_rows_times_what_catch_ups_cost_over_that():
    # A draft forward over 8 rows costs 0.05 s, over 64 rows 0.2 s: a catch-up reading P
    # positions is priced off that curve at P rows, scaled by what the catch-ups timed cost
    # over what the curve said of them. 8 rows 50 positions behind, 64 tokens to go.
    policy = GoodputPolicy(4, probe_every=1000, catch_up_budget=math.inf)
    costs = policy.costs
    policy.observe_timings(positions=8, verify_seconds=0.25, rows=8, draft_forwards=0, draft_seconds=0.0)
    policy.observe_timings(positions=40, verify_seconds=0.26, rows=8, draft_forwards=4, draft_seconds=0.2)
    policy.observe_start_up({}, {8: 0.05, 64: 0.2})
    behind = [RowOutlook(cap=4, acceptance=0.8, model=True, behind=50, remaining=64) for _ in range(8)]
    charged = 8 * 50 * expected_tokens(0.8, 4) / 64  # positions of catch-up a k = 4 step pays for
    curve = {p: 0.05 + 0.15 / 56 * (p - 8) for p in (20, 100, 400)}  # the draft's rows
    assert costs.catch_up(400) == pytest.approx(curve[400])  # none timed: the curve
    assert step_cost(behind, 4, costs) == pytest.approx(0.26 + 4 * 0.05 + curve[400] / 400 * charged)
    assert policy.decide(behind).k == 4  # 8 x 3.4 tokens in 0.52 s against 8 in 0.25 s
    policy.observe_catch_up(100, 3 * curve[100])
    for p in (20, 400):  # one catch-up three times the curve: every size, smaller ones too
        assert costs.catch_up(p) == pytest.approx(3 * curve[p])
    policy.observe_catch_up(20, curve[20])  # one as the curve: the sums' ratio, decayed 0.9
    ratio = (0.9 * 3 * curve[100] + curve[20]) / (0.9 * curve[100] + curve[20])
    assert costs.catch_up(400) == pytest.approx(ratio * curve[400])
    for _ in range(2):
        policy.observe_catch_up(400, 12 * curve[400])
    assert step_cost(behind, 4, costs) == pytest.approx(0.26 + 4 * 0.05 + costs.catch_up(400) / 400 * charged)
    assert costs.catch_up(400) > 10 * curve[400]
    assert policy.decide(behind).k == 0  # 8 x 3.4 tokens in 1.09 s: below 8 in 0.25 s x 1.05


def test_measured_costs_interpolate_between_position_counts():
    costs = MeasuredCosts()
    costs.observe(4, 1.0, 4, 0, 0.0)
    costs.observe(12, 2.0, 4, 2, 0.4)
    assert costs.verify(8) == pytest.approx(1.5)
    assert costs.draft(4) == pytest.approx(0.2)


# Start-up timings shaped like the demo pair's on an AMD EPYC without AMX: the target over
# positions, the draft model over rows, one token a row in empty caches.
START_UP_VERIFY = {16: 0.210, 32: 0.339, 64: 0.608, 128: 1.10}
START_UP_DRAFT = {1: 0.035, 4: 0.045, 16: 0.097, 32: 0.201, 64: 0.35}


def test_start_up_timings_give_a_cost_curve_its_shape_and_the_steps_its_level():
    costs = MeasuredCosts()
    costs.observe_start_up(START_UP_VERIFY, START_UP_DRAFT)
    assert costs.verify(64) == pytest.approx(0.608) and costs.draft(8) == pytest.approx(0.045 + 0.052 / 3)
    costs.observe(32, 0.445, 0, 0, 0.0)  # plain steps of 32 rows, their contexts in the caches
    assert costs.verify(32) == pytest.approx(0.445)
    for positions in (16, 64, 128):  # the nearest size a step timed sets the level
        assert costs.verify(positions) == pytest.approx(START_UP_VERIFY[positions] + 0.106)
    assert costs.verify(48) == pytest.approx((0.445 + 0.714) / 2)  # between a step's and a leveled one
    costs.observe(64, 0.70, 32, 1, 0.23)  # a drafting step: now 64 has a level of its own
    assert costs.verify(64) == pytest.approx(0.70)
    assert costs.verify(128) == pytest.approx(1.10 + 0.70 - 0.608)
    assert costs.draft(32) == pytest.approx(0.23)
    assert costs.draft(64) == pytest.approx(0.35 + 0.23 - 0.201)
    assert costs.draft(1) == pytest.approx(0.035 + 0.23 - 0.201)  # one step's level sets every size


def test_a_wide_batch_is_priced_at_its_steps_level_and_does_not_draft_where_start_up_timings_say_it_would():
    # 32 rows of the demo pair, drafts accepted 95% of the time. Plain steps of 32 rows took
    # 0.445 s and 4 rows' draft forwards 0.065 s. Taken as measured, start-up timings put a k = 1
    # step at 0.61 + 0.20 s, 77 tok/s against a plain step's 72 (1.07x); a step costs more with
    # the rows' contexts in the caches: at its steps' level, 0.71 + 0.22 s, 67 tok/s.
    batch = rows(32, 0.95, cap=4)
    taken_whole = MeasuredCosts(decay=0.9, level_decay=1.0)  # each size its own running average
    for positions, seconds in START_UP_VERIFY.items():
        taken_whole.observe(positions, seconds, 0, 0, 0.0)
    for count, seconds in START_UP_DRAFT.items():
        taken_whole.observe(16, START_UP_VERIFY[16], count, 1, seconds)
    leveled = MeasuredCosts()
    leveled.observe_start_up(START_UP_VERIFY, START_UP_DRAFT)
    for costs in (taken_whole, leveled):
        for _ in range(60):  # a steady level, from 0.339 at start-up where taken whole
            costs.observe(32, 0.445, 0, 0, 0.0)
        costs.observe(12, 0.19, 4, 2, 0.13)
    assert taken_whole.verify(32) == pytest.approx(0.445, rel=0.01)
    assert GoodputPolicy(4, taken_whole, probe_every=1000).decide(batch).k == 1
    policy = GoodputPolicy(4, leveled, probe_every=1, probe_share=1.0)
    for _ in range(8):  # not even a probe: were every draft accepted, k = 1 would not pay
        assert k_and_probing(policy.decide(batch)) == (0, False)


def test_a_stalled_step_enters_the_measured_costs_capped_and_growth_is_still_followed():
    costs = MeasuredCosts(decay=0.9)
    for _ in range(5):
        costs.observe(16, 0.24, 16, 1, 0.1)
    costs.observe(16, 0.40, 16, 1, 0.5)  # the host stalled this step
    level = LEVEL_DECAY + (1 - LEVEL_DECAY) * STALL  # the curve's level, from 1
    assert costs.verify(16) == pytest.approx(level * (0.9 * 0.24 + 0.1 * STALL * 0.24 / level))
    assert costs.draft(16) == pytest.approx(level * (0.9 * 0.1 + 0.1 * STALL * 0.1 / level))
    costs.observe(32, 0.9, 16, 0, 0.0)  # a size timed for the first time enters whole
    assert costs.verify(32) == pytest.approx(0.9)
    for _ in range(40):  # a lasting rise is followed, a bounded step at a time
        costs.observe(16, 0.36, 16, 0, 0.0)
    assert costs.verify(16) == pytest.approx(0.36, rel=0.01)
    before = {size: costs.verify(size) for size in (16, 32)}
    costs.observe(16, 0.1, 16, 0, 0.0)  # a fast step enters whole
    moved = LEVEL_DECAY + (1 - LEVEL_DECAY) * 0.1 / before[16]
    assert costs.verify(16) == pytest.approx(moved * 0.9 * before[16] + 0.1 * 0.1)
    assert costs.verify(32) == pytest.approx(moved * before[32])  # the level of every size


def test_a_change_of_the_hosts_speed_seen_at_one_size_prices_every_size():
    # 16 rows of the demo pair (AMD EPYC): plain steps over 16 positions, drafting steps over 17
    # timed now and then. For 20 steps the host runs plain steps 40% slower, then recovers.
    costs = MeasuredCosts()
    costs.observe_start_up(START_UP_VERIFY, START_UP_DRAFT)
    for _ in range(5):
        for _ in range(10):
            costs.observe(16, 0.24, 0, 0, 0.0)
        costs.observe(17, 0.26, 1, 1, 0.04)
    extra = costs.verify(17) / costs.verify(16)
    assert extra == pytest.approx(0.26 / 0.24, rel=0.01)
    for _ in range(20):
        costs.observe(16, 0.336, 0, 0, 0.0)
    assert costs.verify(16) == pytest.approx(0.336, rel=0.01)
    assert costs.verify(17) / costs.verify(16) == pytest.approx(extra, rel=0.02)  # not 0.26 / 0.336
    for _ in range(20):
        costs.observe(16, 0.24, 0, 0, 0.0)
    assert costs.verify(17) == pytest.approx(0.26, rel=0.02)
    # Where each size is its own running average, 17 positions stay at 0.26 s through the spell,
    # below the 0.336 a plain step is priced at: drafting's extra cost comes out negative.
    averaged = MeasuredCosts(level_decay=1.0)
    averaged.observe_start_up(START_UP_VERIFY, START_UP_DRAFT)
    for _ in range(10):
        averaged.observe(16, 0.24, 0, 0, 0.0)
    averaged.observe(17, 0.26, 1, 1, 0.04)
    for _ in range(20):
        averaged.observe(16, 0.336, 0, 0, 0.0)
    assert averaged.verify(17) < averaged.verify(16)


def test_a_probe_is_flagged_so_that_one_row_drafts():
    policy = GoodputPolicy(5, AFFINE, probe_every=2)
    batch = rows(4, 0.1)
    assert k_and_probing(policy.decide(batch)) == (0, False)
    assert k_and_probing(policy.decide(batch)) == (1, True)
    assert k_and_probing(policy.decide(batch)) == (0, False)


def test_rows_the_draft_model_has_not_read_pay_for_their_catch_up():
    # Verification flat up to 64 positions, then linear; a draft forward a tenth of the target's.
    curve = Curve(verify=lambda positions: max(1.0, positions / 64), draft=lambda rows: 0.1)
    caught_up = [RowOutlook(cap=4, acceptance=0.8, model=True) for _ in range(8)]
    assert GoodputPolicy(4, curve).decide(caught_up).k > 0
    # The same rows with 300-token prompts the draft has not read: the catch-up (2,400 positions,
    # 3.75 target forwards' worth at the draft's tenth) costs more than drafting gains.
    unread = [RowOutlook(cap=4, acceptance=0.8, model=True, behind=300) for _ in range(8)]
    assert GoodputPolicy(4, curve, probe_every=1000).decide(unread).k == 0


def test_a_catch_up_is_spread_over_the_tokens_it_serves():
    curve = Curve(verify=lambda positions: max(1.0, positions / 64), draft=lambda rows: 0.1)
    # The rows of the test above with 1,000 tokens to go: the catch-up serves the next 64
    # (CATCH_UP_HORIZON); a step drafting 4 (3.4 tokens a row) carries 5% of it, 0.2 s.
    unread = [RowOutlook(cap=4, acceptance=0.8, model=True, behind=300, remaining=1000) for _ in range(8)]
    assert step_cost(unread, 4, curve) == pytest.approx(1.0 + 0.4 + 3.75 * expected_tokens(0.8, 4) / 64)
    assert GoodputPolicy(4, curve, probe_every=1000, catch_up_budget=math.inf).decide(unread).k == 4
    # With 2 tokens left, a step drafting 1 is expected to emit 1.8 of them: it carries 90%.
    ending = [RowOutlook(cap=1, acceptance=0.8, model=True, behind=300, remaining=2) for _ in range(8)]
    assert step_cost(ending, 1, curve) == pytest.approx(1.0 + 0.1 + 3.75 * 0.9)


def test_rows_that_leave_soon_are_charged_the_prompts_of_the_rows_replacing_them():
    # 32 rows, none behind, k = 1 widening verification by a tenth; a draft forward a third of a
    # plain step, a catch-up the target's forward over as many positions scaled the same.
    curve = Curve(verify=lambda positions: 0.3 * (1 + 0.1 * (positions / 32 - 1)), draft=lambda rows: 0.1)
    staying = [RowOutlook(cap=1, acceptance=0.87, model=True, prompt=42, budget=1000) for _ in range(32)]
    assert GoodputPolicy(1, curve, probe_every=1000).decide(staying).k == 1
    # 32-token requests: each row's replacement reads a 42-token prompt about every 17 steps,
    # 78 positions a step over the batch (0.19 s), which k = 1's 1.87 tokens a row do not repay.
    leaving = [replace(row, budget=32) for row in staying]
    prompt_read = curve.verify(42) * 0.1 / curve.verify(32)
    seconds = curve.verify(64) + 0.1 + 32 * 42 * expected_tokens(0.87, 1) / 32 * prompt_read / 42
    assert step_cost(leaving, 1, curve) == pytest.approx(seconds)
    assert GoodputPolicy(1, curve, probe_every=1000).decide(leaving).k == 0


def test_a_gain_within_the_estimates_noise_is_not_worth_drafting():
    # Verification 5% dearer per drafted position, acceptance that buys a little more than that.
    curve = Curve(verify=lambda positions: 1.0 + 0.05 * (positions / 4 - 1))
    slightly = rows(4, 0.09, model=False)  # k = 1: 1.09 tokens a row for 1.05 the cost, +4%
    assert GoodputPolicy(5, curve, probe_every=1000).decide(slightly).k == 0
    clearly = rows(4, 0.5, model=False)  # k = 1: 1.5 tokens a row for 1.05 the cost
    assert GoodputPolicy(5, curve, probe_every=1000).decide(clearly).k > 0


def _deliver(policy: GoodputPolicy, batch: list[RowOutlook], rate: float, steps: int) -> list[int]:
    """Run ``steps`` choices on ``batch``, each taking its estimated seconds over ``rate`` where
    it drafted (``rate`` 1: as estimated); the ks chosen."""
    chosen = []
    for _ in range(steps):
        k = policy.decide(batch).k
        chosen.append(k)
        seconds = step_cost(batch, k, policy.costs)
        policy.delivered(seconds / (rate if k else 1.0), round(step_tokens(batch, k)))
    return chosen


def test_drafting_that_delivers_less_than_estimated_stops_and_is_tried_again_later():
    # Estimated at 1.25x plain (k = 1: 1.5 tokens a row for 1.2 the cost), delivering 0.8 of that.
    curve = Curve(verify=lambda positions: 1.0 + 0.2 * (positions / 16 - 1))
    batch = rows(16, 0.5, cap=1, model=False)
    assert _deliver(GoodputPolicy(1, curve, probe_every=1000), batch, 1.0, 100) == [1] * 100  # control
    chosen = _deliver(GoodputPolicy(1, curve, probe_every=1000), batch, 0.8, 100)
    assert chosen[:2] == [1, 1] and sum(chosen) <= 20  # stops within a few steps ...
    assert sum(chosen[50:]) >= 1  # ... and tries again once that evidence fades


def test_what_steps_delivered_is_kept_per_batch_width():
    curve = Curve(verify=lambda positions: 1.0 + 0.2 * (positions / 16 - 1))
    policy = GoodputPolicy(1, curve, probe_every=1000)
    _deliver(policy, rows(16, 0.5, cap=1, model=False), 0.8, 10)
    assert policy.realized.gain(16) < 1 / 1.1  # drafting at 16 rows falls short of 1.1x plain
    assert policy.realized.gain(4) == 1.0 and policy.decide(rows(4, 0.5, cap=1, model=False)).k == 1


def test_realized_rates_compare_drafting_with_plain_steps():
    realized = Realized(decay=0.5, prior=0.0)
    realized.add(16, True, seconds=2.0, estimated_seconds=1.0)
    realized.add(16, False, seconds=1.0, estimated_seconds=0.5)
    assert realized.rate(16, True) == pytest.approx(0.5) and realized.rate(16, False) == pytest.approx(0.5)
    assert realized.gain(31) == pytest.approx(1.0)  # both twice as slow as estimated: no correction
    realized.add(16, False, seconds=0.5, estimated_seconds=0.5)
    # Both kinds decay each step: drafting 0.5 / 1, plain (0.5 + 1) / (1 + 1).
    assert realized.rate(16, False) == pytest.approx(0.75)
    assert realized.gain(16) == pytest.approx(0.5 / 0.75)
    realized.add(16, True, seconds=0.25, estimated_seconds=1.0)
    assert realized.gain(16) == 1.0  # drafting beating its estimates does not push it past them


def test_drafting_unseen_at_a_width_is_taken_to_deliver_as_plain_steps_did():
    realized = Realized(prior=2.0)
    assert realized.gain(8) == 1.0
    realized.add(1, False, seconds=3.0, estimated_seconds=1.0)
    assert realized.rate(1, False) == pytest.approx(3 / 5)
    assert realized.gain(1) == pytest.approx(1.0)


def test_a_catch_up_paid_whole_in_one_step_is_not_held_against_drafting():
    # The draft model reads 400 positions for rows it is behind on: the estimate spreads that over
    # the tokens it serves, the step pays it whole. Drafting delivered as estimated otherwise.
    curve = Curve(verify=lambda positions: 1.0, draft=lambda rows: 0.05, catch_up=lambda positions: 0.01 * positions)
    behind = [RowOutlook(cap=4, acceptance=0.8, model=True, behind=400, remaining=64)]
    policy = GoodputPolicy(4, curve, probe_every=1000)
    decision = policy.decide(behind)
    k = decision.k
    assert k > 0 and decision.drafts == (k,)
    policy.observe_catch_up(400, 4.0)
    policy.delivered(step_cost(behind, k, curve, catch_up=False) + 4.0)
    assert policy.realized.gain(1) == pytest.approx(1.0)


def test_a_probe_waits_until_the_loss_budget_has_room_for_its_catch_up():
    # A plain step 1 s; the first probe would read a 300-token prompt at 0.01 s a position (3
    # plain steps). Bounded, the policy decodes plainly until 2% of its time covers that.
    curve = Curve(verify=lambda positions: 1.0, draft=lambda rows: 0.05, catch_up=lambda positions: 0.01 * positions)
    batch = [RowOutlook(cap=3, acceptance=0.8, model=True, behind=300, remaining=200, prior=True) for _ in range(4)]
    unbounded = GoodputPolicy(3, curve, budget=None)
    assert k_and_probing(unbounded.decide(batch)) == (1, True)
    bounded = GoodputPolicy(3, curve)
    plain_steps = 0
    while not (decision := bounded.decide(batch)).k:
        bounded.delivered(1.0, len(batch))
        plain_steps += 1
    assert decision.probing
    # room = 2% of the time spent + one plain step, forgotten 0.1% a step: 3.05 s needs about 110 steps
    assert 90 <= plain_steps <= 130


def test_drafts_that_are_all_rejected_lose_at_most_the_budget():
    # Drafting looks worth it (acceptance 0.6 on a flat curve) but every draft is rejected: the
    # steps emit a token a row, as plain ones would, and cost more. Unbounded, every step drafts;
    # bounded, the loss stays within LOSS_BUDGET of the time and LOSS_SLACK plain steps.
    curve = Curve(verify=lambda positions: 1.0 + 0.01 * positions, draft=lambda rows: 0.2)
    batch = rows(4, 0.6, cap=3)

    def run(policy: GoodputPolicy) -> tuple[float, float, int]:
        lost = spent = 0.0
        drafted = 0
        plain = step_cost(batch, 0, curve)
        for _ in range(200):
            k = policy.decide(batch).k
            seconds = step_cost(batch, k, curve)
            policy.delivered(seconds, len(batch))
            lost, spent, drafted = lost + seconds - plain, spent + seconds, drafted + (k > 0)
        return lost, spent, drafted

    assert run(GoodputPolicy(3, curve, probe_every=1000, budget=None))[2] == 200
    lost, spent, drafted = run(GoodputPolicy(3, curve, probe_every=1000))
    worst_step = step_cost(batch, 3, curve) - step_cost(batch, 0, curve)
    assert 0 < drafted < 200
    assert lost <= LOSS_BUDGET * spent + LOSS_SLACK * step_cost(batch, 0, curve) + worst_step


def test_the_catch_ups_are_held_until_a_draft_model_token_is_accepted():
    budget = LossBudget()
    budget.record(10.0, 10.0)
    budget.catch_up(2.0)
    assert budget.room(1.0) == pytest.approx(LOSS_BUDGET * 12.0 + LOSS_SLACK - 2.0) and budget.held == 2.0
    budget.repaid()
    assert budget.room(1.0) == pytest.approx(LOSS_BUDGET * 12.0 + LOSS_SLACK) and budget.held == 0.0

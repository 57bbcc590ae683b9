"""Choosing K: the expected-tokens arithmetic and the decisions it leads to."""

from __future__ import annotations

import pytest

from quickdraft.policy import AdaptiveK, FixedK


def feed(policy: AdaptiveK, steps: int, drafted: int, accepted: int, t_draft: float, t_verify: float) -> None:
    for _ in range(steps):
        policy.observe(drafted, accepted, drafted * t_draft, t_verify)


def test_fixed_k_never_drafts_past_the_limit():
    assert FixedK(5).choose_k(3) == 3 and FixedK(5).choose_k(9) == 5


def test_expected_tokens_is_the_leviathan_sum():
    policy = AdaptiveK(max_k=4, prior_acceptance=0.5)
    assert policy.expected_tokens(0) == 1.0
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_starts_at_max_k_until_something_is_measured():
    assert AdaptiveK(max_k=6).choose_k(6) == 6
    assert AdaptiveK(max_k=6).choose_k(2) == 2


def test_good_cheap_drafts_use_the_full_k():
    policy = AdaptiveK(max_k=6)
    feed(policy, 20, drafted=6, accepted=6, t_draft=0.05, t_verify=0.2)
    assert policy.choose_k(6) == 6


def test_poor_drafts_switch_speculation_off_and_probe_now_and_then():
    policy = AdaptiveK(max_k=6, probe_every=4)
    feed(policy, 20, drafted=3, accepted=0, t_draft=0.1, t_verify=0.2)
    choices = [policy.choose_k(6) for _ in range(8)]
    assert choices == [0, 0, 0, 1, 0, 0, 0, 1]


def test_draft_as_costly_as_the_target_does_not_pay():
    policy = AdaptiveK(max_k=4)
    feed(policy, 20, drafted=4, accepted=4, t_draft=0.2, t_verify=0.2)
    assert policy.choose_k(4) == 0  # 5 tokens for 5 forwards' time: no gain


def test_middling_acceptance_picks_the_formula_optimum():
    # a = 0.6, c = 0.25: (1 - a^(k+1)) / ((1 - a)(k c + 1)) peaks at k = 2 (1.4 vs 1.31 at k = 1
    # and 1.39 at k = 3)
    policy = AdaptiveK(max_k=8, decay=0.999)
    for step in range(2000):
        accepted = 1 if step % 5 < 3 else 0  # 3 of 5 first positions accepted
        policy.observe(1, accepted, 0.05, 0.2)
    assert policy.acceptance == pytest.approx(0.6, abs=0.05)
    assert policy.choose_k(8) == 2


def test_recovers_when_acceptance_comes_back():
    policy = AdaptiveK(max_k=5, probe_every=2)
    feed(policy, 20, drafted=2, accepted=0, t_draft=0.1, t_verify=0.2)
    assert policy.choose_k(5) == 0
    for _ in range(30):
        k = policy.choose_k(5)
        policy.observe(k, k, k * 0.05, 0.2)  # every draft accepted again
    assert policy.choose_k(5) == 5

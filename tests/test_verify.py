"""The acceptance rules: hand-built cases, then the distribution of emitted tokens."""

from __future__ import annotations

import pytest
import torch

from conftest import chi_square_p_value
from quickdraft.verify import verify_greedy, verify_sampled

V = 5


def one_hot(token: int, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()


def logits_with_argmax(tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V] logits whose row i has its maximum at tokens[i]."""
    return torch.stack([one_hot(t) * 5.0 for t in tokens])


# ---- greedy -------------------------------------------------------------------------------


def test_greedy_perfect_match_takes_the_bonus_token():
    result = verify_greedy(torch.tensor([1, 2, 3]), logits_with_argmax([1, 2, 3, 4]))
    assert (result.num_accepted, result.next_token) == (3, 4)


def test_greedy_early_mismatch_is_replaced_by_the_target_argmax():
    result = verify_greedy(torch.tensor([1, 2, 3]), logits_with_argmax([1, 0, 3, 4]))
    assert (result.num_accepted, result.next_token) == (1, 0)


def test_greedy_rejection_at_position_zero():
    result = verify_greedy(torch.tensor([1, 2]), logits_with_argmax([4, 2, 3]))
    assert (result.num_accepted, result.next_token) == (0, 4)


def test_greedy_later_matches_after_a_mismatch_do_not_count():
    result = verify_greedy(torch.tensor([1, 2, 3]), logits_with_argmax([0, 2, 3, 4]))
    assert result.num_accepted == 0


def test_greedy_without_drafts_is_plain_argmax():
    result = verify_greedy(torch.empty(0, dtype=torch.long), logits_with_argmax([2]))
    assert (result.num_accepted, result.next_token) == (0, 2)


# ---- sampled, hand-built --------------------------------------------------------------------


def test_sampled_certain_acceptance_and_bonus():
    # p(x) >= q(x) at every draft position: accepted with probability 1; bonus from p[K].
    draft = torch.tensor([1, 2])
    q = torch.stack([one_hot(1) * 0.5 + one_hot(0) * 0.5, one_hot(2)])
    p = torch.stack([one_hot(1), one_hot(2), one_hot(4)])
    for seed in range(20):
        result = verify_sampled(draft, q, p, torch.Generator().manual_seed(seed))
        assert (result.num_accepted, result.next_token) == (2, 4)


def test_sampled_certain_rejection_draws_from_the_residual():
    # p(x) = 0 at position 0: always rejected; residual max(0, p - q) puts all mass on token 3.
    draft = torch.tensor([1, 2])
    q = torch.stack([one_hot(1) * 0.6 + one_hot(3) * 0.4, one_hot(2)])
    p = torch.stack([one_hot(3) * 0.7 + one_hot(4) * 0.3, one_hot(2), one_hot(0)])
    p[0] = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.3])
    # residual = max(0, [0, -0.6, 0, 0.3, 0.3]) -> tokens 3 and 4, half each
    seen = set()
    for seed in range(50):
        result = verify_sampled(draft, q, p, torch.Generator().manual_seed(seed))
        assert result.num_accepted == 0
        seen.add(result.next_token)
    assert seen == {3, 4}


def test_sampled_rejection_in_the_middle():
    draft = torch.tensor([1, 2, 3])
    q = torch.stack([one_hot(1), one_hot(2), one_hot(3)])
    p = torch.stack([one_hot(1), one_hot(0), one_hot(3), one_hot(4)])
    result = verify_sampled(draft, q, p, torch.Generator().manual_seed(0))
    assert (result.num_accepted, result.next_token) == (1, 0)


def test_one_hot_draft_rejection_never_returns_the_rejected_token():
    # q one-hot (no probabilities): accept with probability p(x) = 0.5; on rejection the
    # token is drawn from p with x removed, so it is never x.
    draft = torch.tensor([2])
    p = torch.tensor([[0.25, 0.0, 0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    outcomes = {(r.num_accepted, r.next_token) for s in range(200) for r in [verify_sampled(draft, None, p, torch.Generator().manual_seed(s))]}
    assert outcomes == {(1, 4), (0, 0), (0, 3)}


def test_zero_draft_probability_and_minus_inf_are_safe():
    # q(x) = 0 for a drafted token (cannot happen when sampling, but must not divide by 0).
    draft = torch.tensor([1])
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]])
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    result = verify_sampled(draft, q, p, torch.Generator().manual_seed(0))
    assert (result.num_accepted, result.next_token) == (1, 2)


# ---- sampled, distribution ------------------------------------------------------------------


def _emitted_counts(p, q, draft_sampler, n, verifier=verify_sampled):
    """Run one verification step n times; count first emitted tokens, and second ones."""
    gen = torch.Generator().manual_seed(1234)
    first = torch.zeros(p.shape[1])
    second = torch.zeros(p.shape[1])
    for _ in range(n):
        draft = draft_sampler(gen)
        result = verifier(draft, q, p, gen)
        emitted = draft[: result.num_accepted].tolist() + [result.next_token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


def _random_dists(seed: int, rows: int, vocab: int, sharpness: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=g) * sharpness, dim=-1)


def test_emitted_tokens_follow_p_for_a_distant_draft():
    # Positions are independent here (p does not depend on the prefix), so the first emitted
    # token must follow p[0] and, when it was an accepted draft, the second must follow p[1].
    p = _random_dists(0, 3, 6, 2.0)
    q = _random_dists(1, 2, 6, 2.0)
    sampler = lambda gen: torch.multinomial(q, 1, generator=gen).flatten()  # noqa: E731
    first, second = _emitted_counts(p, q, sampler, 20000)
    assert chi_square_p_value(first, p[0]) > 1e-3
    assert chi_square_p_value(second, p[1]) > 1e-3


def test_one_hot_drafts_keep_p():
    p = _random_dists(2, 3, 6, 1.5)
    fixed = torch.tensor([3, 1])  # a drafter that always proposes the same tokens
    first, second = _emitted_counts(p, None, lambda gen: fixed, 20000)
    assert chi_square_p_value(first, p[0]) > 1e-3
    assert chi_square_p_value(second, p[1]) > 1e-3


def test_the_distribution_test_catches_a_biased_rule():
    # A classic bug: on rejection, sample from p instead of the residual. The same test
    # must fail for it, or the tests above prove nothing.
    def biased(draft, q, p, gen):
        result = verify_sampled(draft, q, p, gen)
        if result.num_accepted < len(draft):
            token = int(torch.multinomial(p[result.num_accepted], 1, generator=gen))
            return type(result)(result.num_accepted, token)
        return result

    p = _random_dists(0, 3, 6, 2.0)
    q = _random_dists(1, 2, 6, 2.0)
    sampler = lambda gen: torch.multinomial(q, 1, generator=gen).flatten()  # noqa: E731
    first, _ = _emitted_counts(p, q, sampler, 20000, verifier=biased)
    assert chi_square_p_value(first, p[0]) < 1e-6


@pytest.mark.parametrize("bad", [-1, V])
def test_draft_tokens_outside_the_vocabulary_are_refused(bad):
    # vLLM's out-of-vocabulary draft test: -1 used to index the last entry and could be emitted.
    from quickdraft.verify_tree import verify_tree_greedy, verify_tree_sampled

    tokens = torch.tensor([1, bad])
    p = torch.full((3, V), 1.0 / V)
    with pytest.raises(ValueError, match="vocabulary"):
        verify_sampled(tokens, None, p, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="vocabulary"):
        verify_greedy(tokens, p.log())
    parents = torch.tensor([-1, 0])
    with pytest.raises(ValueError, match="vocabulary"):
        verify_tree_sampled(tokens, parents, None, p, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="vocabulary"):
        verify_tree_greedy(tokens, parents, p.log())

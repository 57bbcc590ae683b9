"""Acceptance rules for one speculative step: pure functions of tensors and a Generator.

Vocabulary (used everywhere in quickdraft, never switched):

* ``q`` is the **draft's** distribution, the one each draft token was sampled from;
* ``p`` is the **target's** distribution at the same position;
* both are after the same temperature / top-k / top-p (see ``sampling.logits_to_probs``).

A step drafts ``K`` tokens ``x_1..x_K``; the target scores ``K + 1`` positions in one forward
(the distribution after each prefix ``x_<i`` and one more after all ``K``). Words:

* **accepted**: a draft token kept by the rule below;
* **recovered**: the token drawn at the first rejection, from the residual ``norm(max(0, p - q))``;
* **bonus**: the token drawn from ``p`` at position ``K + 1`` when all ``K`` drafts are accepted.

Every step therefore emits ``accepted + 1`` tokens. The rule (Leviathan et al. 2023,
arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318) accepts ``x_i`` with probability
``min(1, p(x_i) / q(x_i))``; the emitted tokens are distributed exactly as sampling from the
target alone. A drafter without probabilities (prompt lookup) is a one-hot ``q``: accept with
probability ``p(x_i)``, and on rejection draw from ``p`` with ``x_i`` removed.

Greedy decoding is the temperature-0 limit: accept while the draft equals the target's argmax;
the first mismatch is replaced by the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.sampling import greedy, sample


@dataclass(frozen=True)
class StepResult:
    """Outcome of verifying one draft chain.

    Attributes:
        num_accepted: how many leading draft tokens were accepted (0..K).
        next_token: the recovered token (after a rejection) or the bonus token (all accepted).
    """

    num_accepted: int
    next_token: int


def _num_leading_true(mask: torch.Tensor) -> int:
    """Length of the run of True at the start of a 1-D bool tensor.

    Example: ``[True, True, False, True] -> 2``. One host sync: the loop needs the count to
    decide how far to roll the caches back.
    """
    return int(torch.cumprod(mask.to(torch.int32), dim=0).sum().item())


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int | torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``: the distribution to draw from after rejecting ``token`` drawn from
    ``q`` (``[V]``; ``None``: one-hot on ``token``, so the residual is ``p`` without it).

    Args:
        p: ``[V]`` the target's distribution at the rejected position.
        q: ``[V]`` the draft's, or None.
        token: the rejected token.

    Returns:
        ``[V]`` normalised.
    """
    if q is None:
        left = p.clone()
        left[token] = 0.0
    else:
        left = torch.clamp(p - q, min=0.0)
    total = left.sum()
    if not bool(total > 0):  # host sync: which distribution to return
        # Only reachable through rounding (a rejection needs p(x) < q(x), so some other token
        # has p > q); p itself is then the right distribution up to that rounding.
        return p
    return left / total


def check_draft_tokens(draft_tokens: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError unless every draft token id is in ``[0, vocab_size)``.

    An id of -1 would otherwise index the last vocabulary entry (negative indexing) and could
    be emitted. One host sync per step: a drafter bug must not become output.
    """
    if draft_tokens.numel() and bool(((draft_tokens < 0) | (draft_tokens >= vocab_size)).any()):
        raise ValueError(
            f"draft token ids must be in [0, {vocab_size}), got {draft_tokens.tolist()}: "
            "the drafter proposed ids outside the target's vocabulary"
        )


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> StepResult:
    """Greedy acceptance.

    Args:
        draft_tokens: ``[K]`` int64 draft tokens (K may be 0).
        target_logits: ``[K + 1, V]`` target logits at the K + 1 verified positions.
    """
    assert draft_tokens.dim() == 1 and target_logits.dim() == 2
    assert target_logits.shape[0] == draft_tokens.shape[0] + 1
    check_draft_tokens(draft_tokens, target_logits.shape[1])
    choice = greedy(target_logits)  # [K + 1]
    k = draft_tokens.shape[0]
    n = _num_leading_true(choice[:k] == draft_tokens) if k else 0
    return StepResult(num_accepted=n, next_token=int(choice[n].item()))


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> StepResult:
    """Speculative sampling: accept with min(1, p/q), recover from the residual, or add a bonus.

    Args:
        draft_tokens: ``[K]`` int64 draft tokens (K may be 0: then this samples from ``p``).
        draft_probs: ``[K, V]`` float32 ``q`` at each draft position, or ``None`` for a drafter
            without probabilities (one-hot ``q`` on each draft token).
        target_probs: ``[K + 1, V]`` float32 ``p`` at each verified position.
        generator: random source for the uniform draws and the recovered/bonus sample.
    """
    assert draft_tokens.dim() == 1 and target_probs.dim() == 2
    k = draft_tokens.shape[0]
    assert target_probs.shape[0] == k + 1
    check_draft_tokens(draft_tokens, target_probs.shape[1])
    positions = torch.arange(k, device=target_probs.device)
    p_x = target_probs[positions, draft_tokens]  # [K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        assert draft_probs.shape == (k, target_probs.shape[1])
        q_x = draft_probs[positions, draft_tokens]  # [K]
    uniform = torch.rand(k, generator=generator, device=target_probs.device)  # [K]
    # Accept iff u < p/q, written without the division: q = 0 (a token the draft could not
    # have drawn) then accepts exactly when p > 0 instead of producing inf/NaN.
    n = _num_leading_true(uniform * q_x < p_x) if k else 0

    if n == k:
        return StepResult(num_accepted=k, next_token=int(sample(target_probs[k], generator).item()))

    q = None if draft_probs is None else draft_probs[n]
    recovered = residual(target_probs[n], q, draft_tokens[n])  # [V]
    return StepResult(num_accepted=n, next_token=int(sample(recovered, generator).item()))

"""How many tokens to draft each step: a fixed K, or K chosen from measured acceptance and costs.

With ``a`` the measured probability that a draft token is accepted given that the ones before it
were, a step that drafts k tokens is expected to emit

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens (the 1 is the target's own recovered or bonus token), and costs ``k * t_draft +
t_verify(k)``. One ``a`` for all positions, rather than one per position, is what lets the
policy judge a longer draft than it has tried lately. ``AdaptiveK`` drafts the k in 0..K with the highest ``E(k) / cost(k)``: it
speculates deeply while drafts are accepted, shortens drafts when they are not, and turns
speculation off (k = 0, plain decoding) when even one draft token does not pay for itself, as at
high temperature with a poor draft. With a constant ``a`` this is the formula of Leviathan et al.:
``(1 - a^(k+1)) / ((1 - a)(k c + 1))`` with ``c = t_draft / t_verify``.
"""

from __future__ import annotations

from typing import Protocol


class SpeculationPolicy(Protocol):
    """Chooses k before each step and learns from what the step did."""

    def choose_k(self, max_k: int) -> int:
        """Number of tokens to draft this step, 0 <= k <= max_k."""
        ...

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Record one step: tokens drafted and accepted, and the time each phase took."""
        ...


class FixedK:
    """Always draft K tokens (fewer only near ``max_new_tokens``)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def choose_k(self, max_k: int) -> int:
        return min(self.k, max_k)

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        pass


class _Average:
    """Exponentially weighted mean; ``None`` until the first sample."""

    def __init__(self, decay: float, value: float | None = None) -> None:
        self.decay = decay
        self.value = value

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.decay * self.value + (1 - self.decay) * sample


class AdaptiveK:
    """Choose k each step to maximise expected tokens per second.

    Args:
        max_k: the largest k ever drafted (the decoder's ``num_speculative_tokens``).
        prior_acceptance: acceptance assumed before anything is measured.
        decay: weight of the past in the running averages (per observation; each draft
            position tried is one acceptance observation).
        probe_every: while speculation is off, draft one token every this many steps so that
            a change in acceptance (a new prompt, a copy-heavy passage) is noticed.

    The estimates persist across generations of the same decoder: a server or benchmark
    learns its workload; a new prompt moves them within a few steps.
    """

    def __init__(
        self,
        max_k: int,
        prior_acceptance: float = 0.8,
        decay: float = 0.9,
        probe_every: int = 8,
    ) -> None:
        self.max_k = max_k
        self.probe_every = probe_every
        self._accept = _Average(decay, prior_acceptance)
        self._draft_seconds = _Average(decay)  # per drafted token
        self._verify_seconds: dict[int, _Average] = {}  # by number of drafts verified
        self._decay = decay
        self._steps_off = 0

    @property
    def acceptance(self) -> float:
        """Current estimate of the probability that a draft token is accepted."""
        return self._accept.value  # type: ignore[return-value]

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a step is expected to emit when drafting k."""
        return sum(self.acceptance**i for i in range(k + 1))

    def _verify_cost(self, k: int) -> float | None:
        measured = [(abs(j - k), avg.value) for j, avg in self._verify_seconds.items()]
        return min(measured)[1] if measured else None

    def choose_k(self, max_k: int) -> int:
        max_k = min(max_k, self.max_k)
        t_draft = self._draft_seconds.value
        if max_k < 1:
            return 0
        if t_draft is None or not self._verify_seconds:
            return max_k  # nothing measured yet: speculate and measure
        best_k, best_rate = 0, 0.0
        for k in range(max_k + 1):
            rate = self.expected_tokens(k) / (k * t_draft + self._verify_cost(k))
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self._steps_off += 1
            if self._steps_off >= self.probe_every:
                self._steps_off = 0
                return 1
        else:
            self._steps_off = 0
        return best_k

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        self._verify_seconds.setdefault(drafted, _Average(self._decay)).add(verify_seconds)
        if drafted == 0:
            return
        self._draft_seconds.add(draft_seconds / drafted)
        # Position i was tried iff positions < i were accepted: i = 0..accepted (capped).
        for i in range(min(accepted + 1, drafted)):
            self._accept.add(1.0 if i < accepted else 0.0)

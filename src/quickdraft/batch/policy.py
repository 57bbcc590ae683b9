"""How many tokens a batch drafts each step: the k that maximises the batch's tokens per second.

A step that lets row ``b`` draft ``k_b = min(k, cap_b)`` tokens is expected to emit
``E_b = (1 - a_b^(k_b+1)) / (1 - a_b)`` tokens from that row (``a_b`` its running acceptance;
the 1 is the target's recovered or bonus token), and costs

    t(k) = d(k) * t_draft(B) + t_verify(B * (1 + max_b k_b))

where ``t_verify(P)`` is the target's forward over ``P`` positions (``B`` rows padded to the
longest draft), ``t_draft(B)`` one draft-model forward over the rows, and ``d(k)`` the draft
forwards the step runs (the longest model draft; 0 for prompt lookup). The policy picks
``argmax_k sum_b E_b / t(k)`` over ``k = 0 .. K`` (SmartSpec's goodput, arXiv:2406.14066), and
drafts only where that beats ``k = 0`` by ``MARGIN``.
``k = 0`` (no speculation) is always a candidate and its cost is measured before anything else,
so a measured cost curve never makes the loaded server choose a step it expects to be slower
than plain batched decoding. Where a forward over many positions costs about one (matrix units,
small batches) long drafts pay; where cost grows with positions (large batches) k falls to 0.

Costs come from ``MeasuredCosts`` (running averages of the engine's timings, interpolated
between the position counts measured) or, in tests, from any ``BatchCosts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from quickdraft.policy import VerifyCost, expected_tokens


# Drafting must be expected to beat plain batched decoding by this share: the estimates are
# running averages of noisy timings, and on the demo pair under load (4 clients, prompt lookup)
# a k = 1 expected to gain a few percent made the steps 15-20% slower.
MARGIN = 0.1


class BatchCosts(Protocol):
    """Seconds of the forwards a step runs; ``None`` while unknown."""

    def verify(self, positions: int) -> float | None:
        """A target forward over ``positions`` positions (rows x padded width)."""
        ...

    def draft(self, rows: int) -> float | None:
        """One draft-model forward over ``rows`` rows."""
        ...

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        """Record a step's timings."""
        ...


class BatchPolicy(Protocol):
    """Chooses each step's k for the batch (``GoodputPolicy``, ``FixedBatchK``).

    Attributes:
        max_k: the most tokens a row drafts.
        last_k: the k chosen last (metrics).
        probing: whether that k is a probe, drafted by one row only (``GoodputPolicy``).
    """

    max_k: int
    last_k: int
    probing: bool

    def choose(self, rows: list[RowOutlook]) -> int:
        """This step's k (0 .. max_k)."""
        ...

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        """Record a step's timings (``BatchCosts.observe``)."""
        ...


class MeasuredCosts:
    """Costs learned from the engine's steps (``quickdraft.policy.VerifyCost`` for each curve)."""

    def __init__(self, decay: float = 0.9) -> None:
        self._verify = VerifyCost(decay)
        self._draft = VerifyCost(decay)

    def verify(self, positions: int) -> float | None:
        return self._verify(positions)

    def draft(self, rows: int) -> float | None:
        return self._draft(rows)

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        self._verify.add(positions, verify_seconds)
        if draft_forwards:
            self._draft.add(rows, draft_seconds / draft_forwards)


class Acceptance:
    """A running probability that a drafted token is accepted (exponentially weighted).

    ``add(rate, count)`` adds ``count`` tried positions whose mean acceptance is ``rate``.
    """

    def __init__(self, value: float, decay: float = 0.9) -> None:
        self.value = value
        self.decay = decay

    def add(self, rate: float, count: int) -> None:
        weight = self.decay**count
        self.value = weight * self.value + (1 - weight) * rate


@dataclass(frozen=True)
class RowOutlook:
    """What the policy knows of one row this step.

    Attributes:
        cap: the most tokens it can draft (``K``, ``max_new_tokens`` left, a lookup copy's length).
        acceptance: its running probability that a drafted token is accepted.
        model: True when its draft comes from the draft model (runs draft forwards).
        fixed: a k the row drafts whatever the policy says (a seeded sampled row), else None.
        behind: tokens the draft model must read before the row drafts with it (its prompt, or
            a passage decoded plainly), paid once.
    """

    cap: int
    acceptance: float
    model: bool
    fixed: int | None = None
    behind: int = 0

    def k(self, k: int) -> int:
        return self.fixed if self.fixed is not None else min(k, self.cap)


def step_cost(rows: list[RowOutlook], k: int, costs: BatchCosts) -> float | None:
    """``t(k)`` (module docstring), or None while a cost it needs is unmeasured."""
    drafts = [row.k(k) for row in rows]
    verify = costs.verify(len(rows) * (1 + max(drafts)))
    forwards = max((d for d, row in zip(drafts, rows) if row.model), default=0)
    draft = costs.draft(len(rows)) if forwards else 0.0
    if verify is None or draft is None:
        return None
    return verify + forwards * draft + _catch_up_cost(rows, drafts, costs, draft)


def _catch_up_cost(rows: list[RowOutlook], drafts: list[int], costs: BatchCosts, draft: float) -> float:
    """Seconds the draft model takes to read what the drafting rows are ``behind`` on: a forward
    over those positions, estimated as the target's over as many positions scaled by the two
    models' cost ratio over these rows. A row that never drafted is behind by its prompt: under
    load that made each step that tried a draft cost as much as a prefill of every row."""
    behind = sum(row.behind for d, row in zip(drafts, rows) if row.model and d)
    if not behind or not draft:
        return 0.0
    target_rows, target_behind = costs.verify(len(rows)), costs.verify(behind)
    if not target_rows or target_behind is None:
        return 0.0
    return target_behind * draft / target_rows


def step_tokens(rows: list[RowOutlook], k: int) -> float:
    """Expected tokens a step drafting up to ``k`` per row emits, over all rows."""
    return sum(expected_tokens(row.acceptance, row.k(k)) for row in rows)


class GoodputPolicy:
    """Chooses each step's k for the whole batch (module docstring).

    Args:
        max_k: the most tokens a row drafts (K).
        costs: where step costs come from (default: measured).
        probe_every: after this many steps without drafting, one step drafts 1 token (a probe),
            so that the acceptance is not frozen at a passage where drafts did not pay.

    Attributes:
        last_k: the k chosen last (for the server's metrics).
        probing: whether that k is a probe: one row drafts, to measure acceptance (the engine
            picks the row whose draft model has the least to catch up on).
    """

    def __init__(self, max_k: int, costs: BatchCosts | None = None, probe_every: int = 16) -> None:
        if max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {max_k}")
        self.max_k = max_k
        self.costs = costs if costs is not None else MeasuredCosts()
        self.probe_every = probe_every
        self.last_k = 0
        self.probing = False
        self._idle = 0  # steps since the policy last let rows draft

    def choose(self, rows: list[RowOutlook]) -> int:
        """This step's k (0 .. K): every row drafts ``min(k, cap)`` unless its k is fixed."""
        self.probing = False
        self.last_k = self._choose(rows)
        self._idle = 0 if self.last_k else self._idle + 1
        return self.last_k

    def _choose(self, rows: list[RowOutlook]) -> int:
        top = min(self.max_k, max((row.cap for row in rows), default=0))
        if top == 0:
            return 0
        plain = step_cost(rows, 0, self.costs)
        if plain is None:
            return 0  # measure the baseline first: it is what every other k is compared with
        rates = {}
        for k in range(top + 1):
            cost = step_cost(rows, k, self.costs)
            if cost is None:
                return k  # unmeasured: try it once (a draft forward over these rows)
            rates[k] = step_tokens(rows, k) / max(cost, 1e-9)
        best = max(rates, key=lambda k: (rates[k], -k))
        if rates[best] < (1 + MARGIN) * rates[0]:
            best = 0
        if best == 0 and self._idle + 1 >= self.probe_every:
            self.probing = True
            return 1
        return best

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        self.costs.observe(positions, verify_seconds, rows, draft_forwards, draft_seconds)


class FixedBatchK:
    """Every row drafts ``min(k, cap)`` every step (``quickdraft serve --fixed-k``, tests)."""

    def __init__(self, k: int) -> None:
        self.max_k = k
        self.last_k = k
        self.probing = False

    def choose(self, rows: list[RowOutlook]) -> int:
        return self.max_k

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        pass

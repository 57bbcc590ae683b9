"""What a step is expected to emit, and what it costs: one model for one sequence and for a batch.

A step that lets row ``b`` draft ``k_b`` tokens is expected to emit
``E_b = (1 - a_b^(k_b+1)) / (1 - a_b)`` tokens from that row (``expected_tokens``; ``a_b`` its
running acceptance, the 1 the target's recovered or bonus token), and costs

    t = d * t_draft(rows drafting) + t_verify(P) + catch-up share        (``step_cost``)

where ``t_verify(P)`` is the target's forward over the ``P`` positions it verifies
(``verified_positions``), ``t_draft`` one draft-model forward over the rows drafting with it,
``d`` the draft forwards the step runs (the longest model draft; 0 for prompt lookup) and the
catch-up share this step's part of the draft model reading what it is behind on
(``_catch_up_cost``). A policy maximises ``sum_b E_b / t``: ``AdaptiveK`` for one row
(``k t_draft + t_verify(k + 1)``), ``GoodputPolicy`` for a batch.

The seconds come from a ``BatchCosts``: ``SequenceCosts`` (one sequence's running averages),
``MeasuredCosts`` (a batch's curves, grounded by start-up timings), or, in tests, functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

# A draft model's catch-up is weighed against the gain of the tokens it serves, at most this many:
# acceptance may change, and a batch may stop drafting (more rows join), before a long request ends.
CATCH_UP_HORIZON = 64
# A timing enters a measured cost (``MeasuredCosts``) at most this many times the cost so far at
# its size: on a shared machine single steps stall, and a stalled plain step taken whole would
# price plain decoding too dear, which no plain step corrects while the batch drafts. Growth as
# contexts lengthen is gradual, and still followed.
STALL = 1.25
# Weight a cost curve's level keeps a step, and its shape at a size a timing (``LeveledCurve``):
# the level follows the machine's speed within two or three steps, so that the shape at the size
# a batch runs takes little of a change every size sees
# (``test_a_change_of_the_hosts_speed_seen_at_one_size_prices_every_size``).
LEVEL_DECAY = 0.5
SHAPE_DECAY = 0.95


def expected_tokens(acceptance: float, k: float) -> float:
    """E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a): tokens a step drafting k is expected
    to emit (see above); k may be a mean draft length. The one copy of the formula: the
    benchmark's report and the doctor use it too."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if acceptance == 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1.0)) / (1.0 - acceptance)


@dataclass(frozen=True)
class RowOutlook:
    """What a policy knows of one row this step (a single sequence is a batch of one row).

    Attributes:
        cap: the most tokens it can draft (``K``, ``max_new_tokens`` left, a lookup copy's length).
        acceptance: its running probability that a drafted token is accepted.
        model: True when its draft comes from the draft model (runs draft forwards).
        fixed: a k the row drafts whatever the policy says (a seeded sampled row), else None.
        behind: tokens the draft model must read before the row drafts with it (its prompt, or
            a passage decoded plainly), paid once.
        remaining: tokens the row may still emit (0: unknown); a catch-up serves the drafts of
            the next ``min(remaining, CATCH_UP_HORIZON)`` of them.
        prior: its ``acceptance`` is the prior's: nothing has drafted from its source yet.
        prompt: tokens the draft model reads of its prompt when it joins (within the draft's
            context window); with ``budget``, the catch-up rows like it cost a drafting server
            that replaces each row that leaves (``_catch_up_positions``).
        budget: tokens it may emit in all (``max_new_tokens``; 0: unknown).
    """

    cap: int
    acceptance: float
    model: bool
    fixed: int | None = None
    behind: int = 0
    remaining: int = 0
    prior: bool = False
    prompt: int = 0
    budget: int = 0

    def k(self, k: int) -> int:
        return self.fixed if self.fixed is not None else min(k, self.cap)


class BatchCosts(Protocol):
    """Seconds of the forwards a step runs; ``None`` while unknown."""

    def verify(self, positions: int) -> float | None:
        """A target forward over ``positions`` positions (rows x padded width)."""
        ...

    def draft(self, rows: int) -> float | None:
        """One draft-model forward over ``rows`` rows."""
        ...

    def catch_up(self, positions: int) -> float | None:
        """A draft-model forward reading ``positions`` positions without logits (rows x padded
        width); ``None`` while unknown."""
        ...

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        """Record a step's timings."""
        ...

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        """Record a draft-model forward that read ``positions`` positions (``catch_up``)."""
        ...

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        """Record the engine's start-up timings (``BatchEngine._time_forwards``): seconds of a
        target forward over each count of positions and of a draft-model forward over each count
        of rows, one token a row in caches of their own."""
        ...


class RunningAverage:
    """Exponentially weighted mean; ``None`` until the first sample."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.decay * self.value + (1 - self.decay) * sample


class VerifyCost:
    """A forward's time as a function of its size (the positions a target's forward verifies,
    the rows a draft forward runs), learned step by step.

    Each size has its own running average; sizes never measured are interpolated linearly
    between the nearest measured ones, and extrapolated beyond the largest with the slope of the
    last two (flat with one): a step over six positions is judged from steps over two and five
    without having to be tried.

    With ``drop_first``, the first forward of each size is not a measurement: it is the first
    over that many positions in the process, where oneDNN builds its kernels for the shape and
    which can take twice a warm one; kept, it would make that size look dear, the sizes beyond
    it dearer still, and the policy would never draft that many again to correct it.
    """

    def __init__(self, decay: float, drop_first: bool = False) -> None:
        self._decay = decay
        self._drop_first = drop_first
        self._by_size: dict[int, RunningAverage] = {}
        self._seen: set[int] = set()  # sizes whose first forward was dropped

    def add(self, size: int, seconds: float) -> None:
        if self._drop_first and size not in self._seen:
            self._seen.add(size)
            return
        self._by_size.setdefault(size, RunningAverage(self._decay)).add(seconds)

    def measured(self, size: int) -> bool:
        return size in self._by_size

    def points(self) -> list[tuple[int, float]]:
        """``(size, seconds)`` of each size measured, by size."""
        return sorted((n, avg.value) for n, avg in self._by_size.items())

    def __call__(self, size: int) -> float | None:
        """Estimated seconds of a forward of ``size`` (``None``: nothing measured)."""
        return interpolated(self.points(), size)


def interpolated(points: list[tuple[int, float]], x: int) -> float | None:
    """The value at ``x`` of the curve through ``points`` (``(x, y)``, sorted by x): linear
    between the nearest points, beyond the last two with their slope (flat with one point),
    never below 0; ``None`` without points."""
    if not points:
        return None
    below = [p for p in points if p[0] <= x]
    above = [p for p in points if p[0] >= x]
    if below and above:
        (n0, t0), (n1, t1) = below[-1], above[0]
        return t0 if n0 == n1 else t0 + (t1 - t0) * (x - n0) / (n1 - n0)
    edge = points[-2:] if below else points[:2]
    if len(edge) == 1:
        return edge[0][1]
    (n0, t0), (n1, t1) = edge
    return max(0.0, t1 + (t1 - t0) / (n1 - n0) * (x - n1))


class SequenceCosts:
    """``BatchCosts`` of one sequence (``AdaptiveK``), each a running average of the steps'
    timings with weight ``decay`` kept per step: the target's forward by positions
    (``VerifyCost``; with ``drop_first``, each count's first forward is not a measurement), the
    draft model's forward over the one row (``draft(1)``: seconds per drafted token) and its
    catch-up per position (0 until one has been timed: it is measured the first time it is paid).
    """

    def __init__(self, decay: float = 0.9, drop_first: bool = True) -> None:
        self._verify = VerifyCost(decay, drop_first)
        self._draft = RunningAverage(decay)
        self._catch_up = RunningAverage(decay)

    def measured(self, positions: int) -> bool:
        """Whether a verification over ``positions`` positions was timed."""
        return self._verify.measured(positions)

    def verify(self, positions: int) -> float | None:
        return self._verify(positions)

    def draft(self, rows: int) -> float | None:
        return self._draft.value

    def catch_up(self, positions: int) -> float | None:
        return positions * (self._catch_up.value or 0.0)

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        self._verify.add(positions, verify_seconds)
        if draft_forwards:
            self._draft.add(draft_seconds / draft_forwards)

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        if positions >= 1:
            self._catch_up.add(seconds / positions)

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        pass


class MeasuredCosts:
    """Costs learned from the engine's steps (``VerifyCost`` for each curve).

    The engine times forwards over a range of sizes when it starts (``observe_start_up``), one
    token a row in empty caches; its steps then time forwards at the sizes a batch runs, in
    caches holding the rows' contexts, with the step's acceptance and draws. A size no step has
    timed is priced off the start-up timing, raised by what the steps took over the start-up
    curve at the timed size nearest it, and every size at the speed the steps ran at lately
    (``LeveledCurve``). A step's forward costs more than its start-up timing by about
    the same at every width: the rows' contexts are in the caches, each of its own length, and a
    verification's time takes in the acceptance and the commit (plain steps of 32 rows ran about
    a quarter over the start-up forward over 32 positions). Start-up timings taken as they are
    beside steps' would price a plain step at the steps' level and a drafting one at the
    start-up's, and make drafting look cheaper than it is.

    A catch-up over ``P`` positions is priced as the draft's forward over ``P`` rows (one
    position each: the same work in its linear layers), times what the catch-ups timed so far
    cost over what that curve predicted for them (decayed sums, ``catch_up_decay`` a catch-up; 1
    before any is timed): a curve of single catch-up timings would have to be extrapolated
    below the smallest size timed, and price a row one token behind like a whole prompt.

    ``decay`` is the weight a size's running average keeps a timing, ``level_decay`` the weight
    the curves' level keeps a step (``LeveledCurve``; at 1.0 each size is its own running average).
    """

    def __init__(self, decay: float = SHAPE_DECAY, catch_up_decay: float = 0.9,
                 level_decay: float = LEVEL_DECAY) -> None:
        self._verify = LeveledCurve(decay, level_decay)  # the target's forward over positions
        self._draft = LeveledCurve(decay, level_decay)  # the draft model's forward over rows
        self._catch_up_decay = catch_up_decay
        # Decayed sums of the catch-ups' seconds and of the draft curve's prediction for them
        self._caught_up = [0.0, 0.0]

    def verify(self, positions: int) -> float | None:
        return self._verify(positions)

    def draft(self, rows: int) -> float | None:
        return self._draft(rows)

    def catch_up(self, positions: int) -> float | None:
        rows = self._draft(positions)
        if rows is None:
            return None
        seconds, predicted = self._caught_up
        return rows * (seconds / predicted if predicted > 0 else 1.0)

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        self._verify.add(positions, verify_seconds)
        if draft_forwards:
            self._draft.add(rows, draft_seconds / draft_forwards)

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        self._verify.start_up(verify)
        self._draft.start_up(draft)

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        predicted = self._draft(positions)
        if predicted:
            self._caught_up = [self._catch_up_decay * self._caught_up[0] + seconds,
                               self._catch_up_decay * self._caught_up[1] + predicted]


class LeveledCurve:
    """One of ``MeasuredCosts``' cost curves: the seconds at a size are the curve's level times
    its shape there.

    The level follows the host from step to step: each step at a size steps have timed moves it
    by the share its seconds came above or below the curve (weight ``LEVEL_DECAY`` kept a step).
    The shape at a size steps have timed is the running average of their seconds over the level
    they ran at (``VerifyCost``); at a size none has timed, its start-up timing shifted by what
    the steps took over the start-up curve at the timed size nearest it; the start-up timings
    themselves before any step. A size's first timing enters the shape whole and leaves the
    level alone: it was priced off another size.

    One level for every size, because a change of the machine's speed is seen only at the sizes
    the batch runs: with a running average per size, a spell of slow plain steps would raise the
    plain size's cost and leave the sizes a drafting step verifies (timed rarely) at their
    faster timings, pricing drafting's extra cost too low.

    Its points are kept until the next timing: a step prices a few dozen sizes."""

    def __init__(self, decay: float, level_decay: float = LEVEL_DECAY) -> None:
        self._shape = VerifyCost(decay)  # steps' seconds over the level they ran at, per size
        self._level = 1.0
        self._level_decay = level_decay
        self._start_up: list[tuple[int, float]] = []  # (size, seconds), by size
        self._points: list[tuple[int, float]] | None = None  # the shape's, None: to build

    def __call__(self, size: int) -> float | None:
        """Estimated seconds at ``size`` (``None``: nothing timed)."""
        if self._points is None:
            self._points = self._shaped()
        shape = interpolated(self._points, size)
        return None if shape is None else self._level * shape

    def add(self, size: int, seconds: float) -> None:
        """A step's timing at ``size``, at most ``STALL`` times the curve's estimate there once
        steps have timed that size."""
        if self._shape.measured(size):
            estimate = self(size)
            seconds = min(seconds, STALL * estimate)
            if estimate > 0:
                kept = self._level_decay
                self._level *= kept + (1.0 - kept) * seconds / estimate
        self._shape.add(size, seconds / self._level)
        self._points = None

    def start_up(self, timings: Mapping[int, float]) -> None:
        """The engine's start-up timings (seconds by size)."""
        self._start_up = sorted(timings.items())
        self._points = None

    def _shaped(self) -> list[tuple[int, float]]:
        """The shape's points: the steps' where timed, the leveled start-up timings elsewhere."""
        timed = self._shape.points()
        if not timed:
            return self._start_up
        points = dict(timed)
        for at, seconds in self._start_up:
            if at not in points:
                nearest, shape = min(timed, key=lambda point: (abs(point[0] - at), -point[0]))
                points[at] = max(0.0, seconds + shape - (interpolated(self._start_up, nearest) or 0.0))
        return sorted(points.items())


def verified_positions(drafts: list[int], ragged: bool) -> int:
    """Positions a verification of rows drafting ``drafts`` tokens computes: each row's own where
    the forward skips the padding (``ragged``), else rows x the longest."""
    return sum(1 + d for d in drafts) if ragged else len(drafts) * (1 + max(drafts, default=0))


def step_cost(rows: list[RowOutlook], k: int, costs: BatchCosts, ragged: bool = False,
              catch_up: bool = True) -> float | None:
    """``t(k)`` (module docstring), or None while a cost it needs is unmeasured. ``ragged``: see
    ``verified_positions``; ``catch_up=False`` leaves the catch-up share out."""
    drafts = [row.k(k) for row in rows]
    verify = costs.verify(verified_positions(drafts, ragged))
    model = [d for d, row in zip(drafts, rows) if row.model and d]
    forwards = max(model, default=0)
    # A draft forward runs over the rows drafting with the model (the rows between them feed
    # nothing, ``BatchEngine._draft_model_tokens``), and is timed over as many. Priced over the
    # whole batch, a step where the rows caught up drafted and the rest did not was charged a
    # forward over every row, and a batch whose other rows were still behind seldom began.
    draft = costs.draft(len(model)) if forwards else 0.0
    if verify is None or draft is None:
        return None
    share = _catch_up_cost(rows, drafts, costs, draft) if catch_up else 0.0
    return verify + forwards * draft + share


def _catch_up_cost(rows: list[RowOutlook], drafts: list[int], costs: BatchCosts, draft: float) -> float:
    """This step's share of the seconds the draft model spends reading for the drafting rows
    (``_catch_up_positions`` each), at the cost per position of the forward the rows behind
    read in now (or of one prompt, where none is behind). How much catching up one step may
    do is ``GoodputPolicy``'s budget."""
    drafting = [(row, d) for d, row in zip(drafts, rows) if row.model and d]
    if not drafting or not draft:
        return 0.0
    charged = sum(_catch_up_positions(row, d) for row, d in drafting)
    if not charged:
        return 0.0
    forward = sum(row.behind for row, _ in drafting)
    if not forward:  # a catch-up's size where none is due now: one new row's prompt
        forward = max(1, round(sum(row.prompt for row, _ in drafting) / len(drafting)))
    return catch_up_seconds(forward, len(rows), costs) / forward * charged


def _catch_up_positions(row: RowOutlook, drafted: int) -> float:
    """The positions the draft model reads for ``row`` charged to a step drafting ``drafted``
    tokens for it: the larger of

    - what it is ``behind``, spread over the tokens that catch-up serves (``_share``): paid
      once, it serves the row's drafts after it (counted in full in one step, a new row's
      prompt would keep a batch from drafting where drafting after it pays);
    - its ``prompt`` spread over its whole ``budget``: a loaded server replaces each row that
      leaves by a new one whose draft reads its prompt, so while it drafts it pays every
      row's prompt once per request, caught-up rows' included (charged only to the rows
      behind, short requests would let a batch draft in steps dominated by catch-ups).
    """
    now = row.behind * _share(row, drafted)
    turnover = row.prompt * expected_tokens(row.acceptance, drafted) / row.budget if row.budget else 0.0
    return max(now, turnover)


def catch_up_seconds(positions: int, rows: int, costs: BatchCosts) -> float:
    """A draft-model forward reading ``positions`` positions: ``BatchCosts.catch_up``, or where
    the costs know none, the target's forward over as many positions scaled by the two models'
    cost ratio over ``rows`` rows (0 while those costs are unknown)."""
    whole = costs.catch_up(positions)
    if whole is not None:
        return whole
    target_rows, target_behind, draft = costs.verify(rows), costs.verify(positions), costs.draft(rows)
    if not target_rows or target_behind is None or draft is None:
        return 0.0
    return target_behind * draft / target_rows


def _share(row: RowOutlook, drafted: int) -> float:
    """The part of a row's catch-up charged to a step drafting ``drafted`` tokens for it: the
    part of the tokens it serves that the step is expected to emit."""
    if not row.remaining:
        return 1.0
    return min(1.0, expected_tokens(row.acceptance, drafted) / min(row.remaining, CATCH_UP_HORIZON))


def step_tokens(rows: list[RowOutlook], k: int) -> float:
    """Expected tokens a step drafting up to ``k`` per row emits, over all rows."""
    return sum(expected_tokens(row.acceptance, row.k(k)) for row in rows)

"""How many tokens a batch drafts each step: the k that maximises the batch's tokens per second.

A step that lets row ``b`` draft ``k_b = min(k, cap_b)`` tokens is expected to emit
``E_b = (1 - a_b^(k_b+1)) / (1 - a_b)`` tokens from that row (``a_b`` its running acceptance;
the 1 is the target's recovered or bonus token), and costs

    t(k) = d(k) * t_draft(B) + t_verify(P) + catch-up share

where ``t_verify(P)`` is the target's forward over ``P`` positions (each row's own where the
target's forward skips padding, the lean forward: ``B + sum_b k_b``; else ``B`` rows padded to
the longest draft), ``t_draft(B)`` one draft-model forward over the rows, ``d(k)`` the draft
forwards the step runs (the longest model draft; 0 for prompt lookup), and the catch-up share
this step's part of the draft model reading what drafting rows are behind on, or the prompts
of the rows that will replace them (``_catch_up_cost``). The policy picks
``argmax_k sum_b E_b / t(k)`` over ``k = 0 .. K`` (SmartSpec's goodput, arXiv:2406.14066), and
drafts only where that beats ``k = 0`` by ``MARGIN``, for the rows the draft model is least
behind on, as many as pays best within ``CATCH_UP_BUDGET`` (``GoodputPolicy._drafting_sets``). Rows still
reading their prompts (``joining``) count as rows that draft nothing: the batch is about to
grow to them, and a step that drafts delays their prefill.
``k = 0`` (no speculation) is always a candidate and its cost is measured before anything else,
so a measured cost curve never makes the loaded server choose a step it expects to be slower
than plain batched decoding. Where a forward over many positions costs about one (matrix units,
small batches) long drafts pay; where cost grows with positions (large batches) k falls to 0.

Costs come from ``MeasuredCosts`` (running averages of the engine's timings, interpolated
between the position counts measured) or, in tests, from any ``BatchCosts``. Estimates built
from them can still be off in a way no single timing shows; each step's seconds are therefore
checked against its estimate, and drafting's estimated rate is scaled by how drafting steps kept
to their estimates at this batch width against how plain steps did (``Realized``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from quickdraft.policy import (
    CATCH_UP_HORIZON,
    PROBE_RESET,
    LossBudget,
    ProbeSchedule,
    VerifyCost,
    expected_tokens,
    interpolated,
)


# Drafting must be expected to beat plain batched decoding by this share, after its estimate is
# scaled by what drafting delivered (``Realized``): the estimates are running averages of noisy
# timings, and a step expected to gain a few percent may well lose more.
MARGIN = 0.05
# Probes may take at most this share of the time: a probe under load (one row reading its
# context, every row verified over two positions) can cost a whole plain step.
PROBE_SHARE = 0.01
# A step lets rows whose draft model is behind draft only while their catch-up costs at most
# this many plain steps (the least behind always may; ``GoodputPolicy.choose``). Much less, and
# rows that joined together never draft (one row's catch-up fits, and one row drafting does not
# pay for the others' wider verification); much more, and one step reading several prompts
# costs more than drafting gains back.
CATCH_UP_BUDGET = 3.0
# The most sets of rows (by how far the draft model is behind on them) a step weighs drafting
# for (``GoodputPolicy._drafting_sets``): each costs K + 1 step estimates.
DRAFTING_SETS = 4
# Weight kept, per step of the same batch width, of what earlier steps delivered against their
# estimates (``Realized``): about 100 steps. What drafting delivered fades while the batch does
# not draft, so the estimates are tried again, rarely enough that a drafting estimate that
# keeps failing costs a fraction of a percent (drafting at 0.875x plain: 2% of the steps).
REALIZED_DECAY = 0.99
# Weight the batch's loss budget (``quickdraft.policy.LossBudget``) keeps a step: about 1000
# steps, so that its room is at most about 20 plain steps more than the balance of the last
# thousand, and what drafting gained long ago does not license a long loss now.
BUDGET_DECAY = 0.999
# Steps' worth of estimates taken as kept before any step is seen (``Realized``).
REALIZED_PRIOR = 2.0
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


@dataclass(frozen=True)
class Decision:
    """What a step drafts, as a ``BatchPolicy`` chose it.

    Attributes:
        k: the batch's k (0 .. max_k): row b drafts ``min(k, cap_b)``, or its fixed k.
        drafts: the tokens each decoding row drafts (``RowOutlook.k`` of ``k``, or 0 for a row
            kept from drafting this step).
        probing: ``k`` is a probe: one token, drafted to measure acceptance (``GoodputPolicy``).
        gain: the factor put on drafting's estimated rate (``Realized.gain``; 1.0 where the
            policy does not check its estimates).
        rates: the expected tokens per second of the step chosen and of a plain step (``None``
            where the policy does not estimate them, or could not).
    """

    k: int
    drafts: tuple[int, ...]
    probing: bool = False
    gain: float = 1.0
    rates: tuple[float, float] | None = None


class BatchPolicy(Protocol):
    """Chooses each step's k for the batch (``GoodputPolicy``, ``FixedBatchK``).

    Attributes:
        max_k: the most tokens a row drafts.
    """

    max_k: int

    def choose(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        """This step's ``Decision`` for the decoding ``rows``. ``joining``: rows still reading
        their prompts, which decode from a later step; ``ragged``: whether the verification
        computes each row's own positions (``verified_positions``: the target's runner says)."""
        ...

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        """Record a step's timings (``BatchCosts.observe``)."""
        ...

    def delivered(self, seconds: float, tokens: int = 0, model_accepted: int = 0) -> None:
        """The seconds the step last chosen took (drafting, catch-up, verification and
        acceptance; not the prefill), the tokens it emitted and how many of the draft model's
        tokens were accepted."""
        ...

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        """Record a catch-up forward of the draft model (``BatchCosts.observe_catch_up``)."""
        ...

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        """Record the engine's start-up timings (``BatchCosts.observe_start_up``)."""
        ...


class MeasuredCosts:
    """Costs learned from the engine's steps (``quickdraft.policy.VerifyCost`` for each curve).

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


class Realized:
    """How long steps took against the policy's estimates, for drafting and for plain steps
    apart, per batch width (decoding rows, by powers of two): each step's seconds over the
    seconds estimated, averaged with weights decaying by ``decay`` per step of that width (both
    kinds decay, so that evidence against drafting fades while the batch does not draft), from
    a prior of ``prior`` steps: plain steps that took their estimates, and drafting steps that
    ran as fast against theirs as plain steps did.

    ``gain(rows)`` is by how much drafting steps overran their estimates more than plain steps
    did, at most 1: the factor on drafting's estimated rate against plain decoding's. The
    estimates price a step from start-up timings and running averages, which can be off in a
    way no single timing shows (draft forwards and verification dearer in a loaded batch than
    timed). The factor only ever holds drafting back: uncapped, plain steps that overran their
    estimates would make drafting look several times better before it had drafted at all.

    Tokens are not checked: the running acceptance the estimates price them with takes in each
    step's outcome already, and checking it here too would count a fall of acceptance twice.
    """

    def __init__(self, decay: float = REALIZED_DECAY, prior: float = REALIZED_PRIOR) -> None:
        self.decay = decay
        self.prior = prior
        # width bucket -> drafting? -> [steps, seconds over estimated], decayed sums (the rates
        # are ratios of the two: the weights cancel)
        self._sums: dict[int, dict[bool, list[float]]] = {}

    def add(self, rows: int, drafting: bool, seconds: float, estimated_seconds: float) -> None:
        """Record a step over ``rows`` decoding rows against its estimated seconds."""
        if estimated_seconds <= 0:
            return
        sums = self._sums.setdefault(rows.bit_length(), {True: [0.0, 0.0], False: [0.0, 0.0]})
        for kind in sums.values():
            kind[:] = [self.decay * value for value in kind]
        sums[drafting][0] += 1.0
        sums[drafting][1] += seconds / estimated_seconds

    def rate(self, rows: int, drafting: bool) -> float:
        """Estimated seconds over taken, for steps of this kind at this width."""
        return self._rates(rows)[drafting]

    def gain(self, rows: int) -> float:
        """The factor on drafting's estimated rate against plain decoding's (class docstring)."""
        plain, drafting = self._rates(rows)
        return min(1.0, drafting / plain)

    def _rates(self, rows: int) -> tuple[float, float]:
        """``rate`` of plain and of drafting steps at this width."""
        sums = self._sums.get(rows.bit_length(), {})
        steps, overrun = sums.get(False, (0.0, 0.0))
        plain = (self.prior + steps) / (self.prior + overrun)
        steps, overrun = sums.get(True, (0.0, 0.0))
        return plain, (self.prior * plain + steps) / (self.prior + overrun)


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


# A row still reading its prompt, as ``GoodputPolicy`` counts it: one token a step, no draft.
# Judged without them, the first decoding rows of clients joining at once would draft (their
# draft model reading their prompts) for the few steps before the batch grows, where drafting
# does not pay, and delay the other rows' prefill.
JOINING_ROW = RowOutlook(cap=0, acceptance=0.0, model=False)


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


def _ideal_tokens(row: RowOutlook, k: int, probed_model: bool) -> float:
    """Tokens ``row`` emits in a step drafting up to ``k`` were every draft of the source a probe
    measures accepted: the draft model's where a probe drafts with it (``_probers``: the rows
    of it whose k is not fixed), else prompt lookup's; a row of the other source at its running
    acceptance (counted as accepted too, many rows' copies would let a batch where the draft
    model cannot pay keep probing it)."""
    if row.model or not probed_model:
        return 1 + row.k(k)
    return expected_tokens(row.acceptance, row.k(k))


def _probers(rows: list[RowOutlook]) -> set[int]:
    """The rows a probe drafts for with the draft model: the one it has the least to catch up
    on (after a plain passage every row's draft must read what it missed; over all rows that
    cost about a prefill), or every row it is not behind on: their probe costs one draft
    forward and measures each of them (one row's token would leave the acceptance where the
    rows' first tokens, the least predictable, set it)."""
    model = [i for i, row in enumerate(rows) if row.model and row.fixed is None]
    if not model:
        return set()
    level = [i for i in model if not rows[i].behind]
    return set(level) if level else {min(model, key=lambda i: rows[i].behind)}


def _prober_only(rows: list[RowOutlook]) -> list[RowOutlook]:
    """``rows`` as a probe drafts them: of the rows drafting with the draft model, ``_probers``."""
    model = {i for i, row in enumerate(rows) if row.model and row.fixed is None}
    return _kept_from_drafting(rows, model - _probers(rows))


def _kept_from_drafting(rows: list[RowOutlook], kept: set[int]) -> list[RowOutlook]:
    """``rows`` with ``cap`` 0 at the indexes ``kept`` (a fixed k still drafts: ``RowOutlook.k``)."""
    return [replace(row, cap=0) if i in kept else row for i, row in enumerate(rows)]


# ``GoodputPolicy``'s default budget (a sentinel: ``None`` there means no budget).
BOUNDED = LossBudget()


class GoodputPolicy:
    """Chooses each step's k for the whole batch (module docstring).

    Args:
        max_k: the most tokens a row drafts (K).
        costs: where step costs come from (default: measured).
        probe_every: after this many steps without drafting, one step drafts 1 token (a probe),
            so that the acceptance is not frozen at a passage where drafts did not pay; and no
            probe while the batch is narrower than it was in this many steps before (``choose``).
        probe_share: the most of the time probes may take (``ProbeSchedule.probed``).
        catch_up_budget: the most a step's catch-ups may cost, in plain steps (``_drafting_sets``).
        max_probe_every: each probe that finds drafting still short of paying doubles the wait
            for the next, up to this (``quickdraft.policy.ProbeSchedule``): under load a probe
            widens the whole batch's verification and makes its row's draft catch up.
        margin: the share by which drafting must be expected to beat plain decoding (``MARGIN``).
        budget: the loss budget that bounds what exploring costs (``quickdraft.policy.LossBudget``;
            default: ``LOSS_BUDGET`` of the time and ``LOSS_SLACK`` plain steps, forgetting
            ``BUDGET_DECAY`` a step); ``None``: unbounded.

    Drafting's estimated rate is scaled by how drafting steps kept to their estimated seconds at
    this batch width against how plain steps did (``Realized.gain``, from ``delivered``).

    A probe (``Decision.probing``) drafts one token with the rows ``_prober_only`` keeps: the
    one the draft model has the least to catch up on, or every row it is not behind on.
    """

    def __init__(self, max_k: int, costs: BatchCosts | None = None, probe_every: int = 16,
                 max_probe_every: int = 256, probe_share: float = PROBE_SHARE,
                 catch_up_budget: float = CATCH_UP_BUDGET, margin: float = MARGIN,
                 budget: LossBudget | None = BOUNDED) -> None:
        if max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {max_k}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.margin = margin
        self.max_k = max_k
        self.costs = costs if costs is not None else MeasuredCosts()
        self._ragged = False  # the last ``choose``'s (``verified_positions``)
        self._k = 0  # the k the last ``choose`` chose
        self._drafting = False  # whether a row drafts in it
        self._probes = ProbeSchedule(probe_every, max_probe_every)
        self._probe_share = probe_share
        self._catch_up_budget = catch_up_budget
        self._probe_seconds: float | None = None  # what the last step, a probe, cost as measured
        self.realized = Realized()
        self.budget = LossBudget(decay=BUDGET_DECAY) if budget is BOUNDED else budget
        # The last step's rows as chosen and its decoding rows, for the budget (``delivered``)
        self._budgeted: tuple[list[RowOutlook], list[RowOutlook]] | None = None
        self._gain = 1.0  # this step's ``Realized.gain``
        # The last step's decoding rows, whether it drafted, and its estimated seconds (None: a
        # probe, or unpriced)
        self._estimate: tuple[int, bool, float] | None = None
        self._catching_up = 0.0  # seconds of the draft model's catch-ups this step
        self._widths: deque[int] = deque(maxlen=probe_every)  # decoding rows of the last steps

    def choose(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        """This step's ``Decision``: its k (0 .. K), and what each row drafts.

        The rows that draft are those the draft model is least behind on, as many as pays best
        (``_drafting_sets``; their catch-ups spread over the tokens they serve,
        ``_catch_up_cost``), each ``min(k, cap)`` or its fixed k; the others draft 0 and catch
        up in a later step, if ever. Judged on every row, a batch that decoded plainly for a few
        steps would never draft again: each step leaves every row a token further behind, and
        its older rows, with few tokens left, are not worth catching up."""
        self._ragged = ragged
        decoding = len(rows)
        rows = rows + [JOINING_ROW] * joining
        narrowed = decoding < max(self._widths, default=0)  # than in the last steps
        self._widths.append(decoding)
        if self._probe_seconds is not None:
            self._charge_probe(rows, self._probe_seconds)
        self._gain = self.realized.gain(decoding)
        self._catching_up = 0.0
        room = self._room(rows)
        best, rate, near_paying, could_pay, drafting = self._best_of_sets(rows, room)
        plain = self._step_cost(rows, 0)
        plain_rate = step_tokens(rows, 0) / plain if plain else None
        rates = None if best is None or plain_rate is None else (rate if best else plain_rate, plain_rate)
        if best is None or (best and any(row.model and row.prior for row in rows)):
            # The draft model's first step is a probe (its costs unknown, or its acceptance
            # still the prior's): tried by every row, the first step would make each of them read
            # its prompt, which costs a few plain steps in a wide batch. It waits until the
            # loss budget has room for it (its catch-up included: a probe is not chosen for a
            # gain that repays it).
            probing = self._probe_cost(rows) <= room
            best = 1 if probing else 0
        else:
            if near_paying:
                self._probes.near_paying()
            self._probes.step(used=best > 0)
            # No probe while rows join: the batch is about to widen, where a probe judged at
            # its present width would not be due, and the probe's catch-up delays their
            # prefill. Nor while the batch is narrower than it was a few steps before: it is
            # between waves of requests, or draining, and what a probe measures there is used
            # at widths the batch leaves a step later.
            probing = (best == 0 and could_pay and not joining and not narrowed and self._probes.due()
                       and self._probe_cost(rows) <= room)
            if probing:
                self._probes.probed(self._probe_cost(rows) / max(plain or 0.0, 1e-9), self._probe_share)
        self._k = k = 1 if probing else best
        chosen = (_prober_only(rows) if probing else drafting)[:decoding]
        drafts = tuple(row.k(k) for row in chosen)
        self._drafting = any(drafts)
        self._budgeted = (chosen, rows[:decoding])
        self._probe_seconds = 0.0 if probing else None
        self._estimate = None if probing else self._estimated(drafting[:decoding])
        return Decision(k, drafts, probing, self._gain, rates)

    def _estimated(self, rows: list[RowOutlook]) -> tuple[int, bool, float] | None:
        """``_estimate`` of a step drafting ``_k`` over ``rows`` (the decoding ones), its
        catch-ups left out (``delivered``)."""
        seconds = step_cost(rows, self._k, self.costs, self._ragged, catch_up=False)
        if seconds is None:
            return None
        return len(rows), self._drafting, seconds

    def _room(self, rows: list[RowOutlook]) -> float:
        """Seconds a step over ``rows`` may lose against a plain step (``LossBudget``; the catch-ups
        held count as room: they are paid whatever comes next)."""
        plain = step_cost(rows, 0, self.costs, self._ragged, catch_up=False)
        if self.budget is None or plain is None:
            return float("inf")
        return self.budget.room(plain) + self.budget.held

    def delivered(self, seconds: float, tokens: int = 0, model_accepted: int = 0) -> None:
        """The step last chosen took ``seconds``, emitted ``tokens`` and had ``model_accepted``
        of the draft model's tokens accepted.

        The loss budget counts the step at its estimated cost, from the estimates its own
        timings have just moved (``observe`` comes first), against the plain steps its tokens
        are worth: its time against them is mostly the host's noise. A draft-model token
        accepted repays the catch-ups held (``LossBudget.repaid``).

        Check the step against its estimate (``Realized``), without its catch-ups: the
        estimate spreads a catch-up over the tokens it serves while the step pays it whole
        (counted, a first drafting step that read a prompt would make drafting look several
        times dearer than it is), and catch-ups are priced apart (``MeasuredCosts.catch_up``)."""
        if self._estimate is not None:
            rows, drafting, estimated_seconds = self._estimate
            self.realized.add(rows, drafting, seconds - self._catching_up, estimated_seconds)
            self._estimate = None
        if self.budget is not None and self._budgeted is not None:
            chosen, decoding = self._budgeted
            cost = step_cost(chosen, self._k, self.costs, self._ragged, catch_up=False)
            plain = step_cost(decoding, 0, self.costs, self._ragged, catch_up=False)
            if cost is not None and plain is not None and decoding:
                self.budget.record(tokens * plain / len(decoding), cost)
            if model_accepted:
                self.budget.repaid()
            self._budgeted = None

    def _step_cost(self, rows: list[RowOutlook], k: int) -> float | None:
        """``step_cost`` on this policy's costs and this step's verification (``ragged``)."""
        return step_cost(rows, k, self.costs, self._ragged)

    def _charge_probe(self, rows: list[RowOutlook], seconds: float) -> None:
        """Space the probes by what the last one cost (``seconds``: its verification, draft forward
        and catch-up) rather than by its estimate: a probe's catch-up in a wide batch can cost
        several times what it was estimated at, and spaced by the estimate probes would take
        several percent of the time."""
        plain = self._step_cost(rows, 0)
        if plain:
            self._probes.charge(max(0.0, seconds - plain) / plain, self._probe_share)

    def _drafting_sets(self, rows: list[RowOutlook]) -> list[list[RowOutlook]]:
        """The sets of rows a step may draft for, as ``rows`` with ``cap`` 0 for the rest: the
        rows the draft model is behind on, least behind first, while their catch-up costs at
        most ``catch_up_budget`` plain steps (the least behind always may: a long prompt would
        otherwise never draft), cut where the lag grows (at most ``DRAFTING_SETS`` cuts);
        rows it is not behind on, and prompt-lookup copies, are in every set."""
        plain = self._step_cost(rows, 0)
        behind = sorted((row.behind, i) for i, row in enumerate(rows) if row.model and row.behind and row.fixed is None)
        if plain is None or not behind:
            return [rows]
        reading, admitted = 0, 0
        for lag, _ in behind:
            if admitted and catch_up_seconds(reading + lag, len(rows), self.costs) > self._catch_up_budget * plain:
                break
            reading += lag
            admitted += 1
        cuts = [n for n in range(1, admitted + 1) if n == admitted or behind[n][0] > behind[n - 1][0]]
        if len(cuts) > DRAFTING_SETS:
            cuts = [cuts[round(j * (len(cuts) - 1) / (DRAFTING_SETS - 1))] for j in range(DRAFTING_SETS)]
        return [_kept_from_drafting(rows, {i for _, i in behind[n:]}) for n in cuts]

    def _best_of_sets(self, rows: list[RowOutlook], room: float) -> tuple[int | None, float, bool, bool, list[RowOutlook]]:
        """``_best`` of the set of drafting rows (``_drafting_sets``) that pays best: its k and
        rate; near paying and could pay if any set does; and that set."""
        chosen: tuple[int, float, list[RowOutlook]] | None = None
        near_paying = could_pay = False
        for candidate in self._drafting_sets(rows):
            k, rate, near, could = self._best(candidate, room)
            if k is None:
                return None, 0.0, False, True, rows
            near_paying, could_pay = near_paying or near, could_pay or could
            if chosen is None or rate > chosen[1]:
                chosen = (k, rate, candidate)
        assert chosen is not None
        return chosen[0], chosen[1], near_paying, could_pay, chosen[2]

    def _best(self, rows: list[RowOutlook], room: float) -> tuple[int | None, float, bool, bool]:
        """The k of the most expected tokens per second (0 unless it beats plain decoding by
        ``margin``; None while no draft forward is timed; only a k that, with every draft
        rejected, loses at most ``room`` against a plain step) and that rate; whether some k > 0
        comes near paying (``PROBE_RESET``); and whether one could pay at all, were every draft
        of the source a probe measures accepted (``_ideal_tokens``). Where none could (a large
        batch on a steep cost curve, rows whose drafts are far behind), a probe learns nothing
        worth its cost (in a wide batch, about two plain steps)."""
        top = min(self.max_k, max((row.cap for row in rows), default=0))
        plain = self._step_cost(rows, 0)
        if top == 0 or plain is None:  # without a plain step's cost, measure that first
            return 0, 0.0, False, False
        rates, ideal = {}, {}
        probed_model = bool(_probers(rows))  # a probe drafts with the draft model
        bare = step_cost(rows, 0, self.costs, self._ragged, catch_up=False) or 0.0
        fits = [0]  # the k whose worst case (every draft rejected) the budget has room for
        for k in range(top + 1):
            cost = plain if k == 0 else self._step_cost(rows, k)
            if cost is None:
                return None, 0.0, False, True
            rates[k] = step_tokens(rows, k) / max(cost, 1e-9) * (self._gain if k else 1.0)
            ideal[k] = sum(_ideal_tokens(row, k, probed_model) for row in rows) / max(cost, 1e-9)
            if k and (step_cost(rows, k, self.costs, self._ragged, catch_up=False) or 0.0) - bare <= room:
                fits.append(k)
        best = max(fits, key=lambda k: (rates[k], -k))
        if rates[best] < (1 + self.margin) * rates[0]:
            best = 0
        near_paying = max(rates[k] for k in rates if k) > PROBE_RESET * rates[0]
        could_pay = max(ideal[k] for k in ideal if k) >= (1 + self.margin) * rates[0]
        return best, rates[best], near_paying, could_pay

    def _probe_cost(self, rows: list[RowOutlook]) -> float:
        """Seconds a probe adds to a plain step: the rows drafting in it (``_prober_only``)
        verified over two positions (every row, where the verification pads rows to the
        longest: ``ragged``), and the draft model's forward over its probers and its catch-up
        on them."""
        probers = _probers(rows)
        widened = verified_positions([row.k(1) for row in _prober_only(rows)], self._ragged)
        widen = max(0.0, (self.costs.verify(widened) or 0.0) - (self.costs.verify(len(rows)) or 0.0))
        if not probers:
            return widen
        reading = sum(rows[i].behind for i in probers)
        return (widen + (self.costs.draft(len(probers)) or 0.0)
                + (catch_up_seconds(reading, len(probers), self.costs) if reading else 0.0))

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        self.costs.observe(positions, verify_seconds, rows, draft_forwards, draft_seconds)
        if self._probe_seconds is not None:
            self._probe_seconds += verify_seconds + draft_seconds

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        self.costs.observe_catch_up(positions, seconds)
        self._catching_up += seconds
        if self.budget is not None:
            self.budget.catch_up(seconds)
        if self._probe_seconds is not None:
            self._probe_seconds += seconds

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        self.costs.observe_start_up(verify, draft)


class FixedBatchK:
    """Every row drafts ``min(k, cap)`` every step (``quickdraft serve --fixed-k``, tests)."""

    def __init__(self, k: int) -> None:
        self.max_k = self.k = k

    def choose(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        return Decision(self.k, tuple(row.k(self.k) for row in rows))

    def observe(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                draft_seconds: float) -> None:
        pass

    def delivered(self, seconds: float, tokens: int = 0, model_accepted: int = 0) -> None:
        pass

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        pass

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        pass

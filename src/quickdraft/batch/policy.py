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
of the rows that will replace them (``quickdraft.costs._catch_up_cost``). The policy picks
``argmax_k sum_b E_b / t(k)`` over ``k = 0 .. K`` (SmartSpec's goodput, arXiv:2406.14066), and
drafts only where that beats ``k = 0`` by ``MARGIN``, for the rows the draft model is least
behind on, as many as pays best within ``CATCH_UP_BUDGET`` (``GoodputPolicy._drafting_sets``). Rows still
reading their prompts (``joining``) count as rows that draft nothing: the batch is about to
grow to them, and a step that drafts delays their prefill.
``k = 0`` (no speculation) is always a candidate and its cost is measured before anything else,
so a measured cost curve never makes the loaded server choose a step it expects to be slower
than plain batched decoding. Where a forward over many positions costs about one (matrix units,
small batches) long drafts pay; where cost grows with positions (large batches) k falls to 0.

Costs come from ``quickdraft.costs.MeasuredCosts`` (running averages of the engine's timings, interpolated
between the position counts measured) or, in tests, from any ``BatchCosts``. Estimates built
from them can still be off in a way no single timing shows; each step's seconds are therefore
checked against its estimate, and drafting's estimated rate is scaled by how drafting steps kept
to their estimates at this batch width against how plain steps did (``Realized``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from quickdraft.costs import (
    BatchCosts,
    MeasuredCosts,
    RowOutlook,
    catch_up_seconds,
    expected_tokens,
    step_cost,
    step_tokens,
    verified_positions,
)
from quickdraft.policy import PROBE_RESET, Decision, LossBudget, ProbeSchedule


# Drafting must be expected to beat plain batched decoding by this share, after its estimate is
# scaled by what drafting delivered (``Realized``): the estimates are running averages of noisy
# timings, and a step expected to gain a few percent may well lose more.
MARGIN = 0.05
# Probes may take at most this share of the time: a probe under load (one row reading its
# context, every row verified over two positions) can cost a whole plain step.
PROBE_SHARE = 0.01
# A step lets rows whose draft model is behind draft only while their catch-up costs at most
# this many plain steps (the least behind always may; ``GoodputPolicy.decide``). Much less, and
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
class BatchPolicy(Protocol):
    """Chooses each step's k for the batch (``GoodputPolicy``, ``quickdraft.policy.FixedK``).

    Attributes:
        max_k: the most tokens a row drafts.
    """

    max_k: int

    def decide(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        """This step's ``Decision`` for the decoding ``rows``. ``joining``: rows still reading
        their prompts, which decode from a later step; ``ragged``: whether the verification
        computes each row's own positions (``verified_positions``: the target's runner says)."""
        ...

    def observe_timings(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
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


# A row still reading its prompt, as ``GoodputPolicy`` counts it: one token a step, no draft.
# Judged without them, the first decoding rows of clients joining at once would draft (their
# draft model reading their prompts) for the few steps before the batch grows, where drafting
# does not pay, and delay the other rows' prefill.
JOINING_ROW = RowOutlook(cap=0, acceptance=0.0, model=False)


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
            probe while the batch is narrower than it was in this many steps before (``decide``).
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
        self._ragged = False  # the last ``decide``'s (``verified_positions``)
        self._k = 0  # the k the last ``decide`` chose
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

    def decide(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
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
            probing = self.probe_cost(rows) <= room
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
                       and self.probe_cost(rows) <= room)
            if probing:
                self._probes.probed(self.probe_cost(rows) / max(plain or 0.0, 1e-9), self._probe_share)
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
        timings have just moved (``observe_timings`` comes first), against the plain steps its tokens
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

    def probe_cost(self, rows: list[RowOutlook]) -> float:
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

    def observe_timings(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
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

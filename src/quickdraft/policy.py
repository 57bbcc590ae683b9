"""What to draft each step: which drafter, and how many tokens (0 = plain decoding).

A step chooses between the drafts on offer: the drafter's (a draft model, a head, prompt lookup
as the only drafter) and, in front of a model, prompt lookup's copy from the context when the
context has a match. With ``a`` the measured probability that a token from that source is
accepted given that the ones before it were, a step that drafts k tokens is expected to emit

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens (the 1 is the target's own recovered or bonus token), and costs ``k * t_draft +
t_verify(k)``, where ``t_verify(k)`` is the target's forward over k + 1 positions: the batch's
cost model (``quickdraft.costs.step_cost``) at one row, a copy's draft free. One ``a`` per
source for all positions, rather than one per position, is what lets the policy judge a longer
draft than it has tried lately. With ``t_verify`` constant this is the formula of Leviathan et
al., ``(1 - a^(k+1)) / ((1 - a)(k c + 1))`` with ``c = t_draft / t_verify``.

``t_verify`` is measured, not assumed: where a forward over six positions costs about one (a
CPU with bfloat16 matrix units, a GPU) long drafts are nearly free to check, and where it costs
four or five (AVX2 without bfloat16 dot products) a draft must be very good to pay. The same
rule covers a lookup copy: free to draft, but not free to verify, so a poorly matching copy is
cut short or not verified at all. Plain decoding (k = 0) is always a candidate.

A draft model reads the prompt when it first drafts, and what it missed while it did not draft,
when it next does (``Drafter.behind``): that catch-up is paid once and serves the tokens it
drafts after, so a step drafting k from it is charged ``E(k) / min(remaining, CATCH_UP_HORIZON)``
of it. Where drafting cannot repay it, the draft never reads the prompt at all.

Estimates can be wrong: acceptance starts from a prior, a probe tries what lost before, and a
new prompt may draft worse than the last. A loss budget bounds what that costs: each
generation keeps the balance of its steps, the plain-step time of the tokens they emitted minus
what they cost, and a step may draft only what, even if every drafted token is rejected, keeps
the balance above ``-(LOSS_BUDGET x time spent + LOSS_SLACK plain steps)``; a probe must fit
its catch-up too (a draft chosen for its rate has it repaid by the gain). A catch-up counts as
lost until the drafter has a token accepted, then no longer: a first draft that read a prompt
and was accepted would otherwise keep the next steps plain. Until then tries (the drafter's and
prompt lookup's) may still lose the room the catch-ups took: those are paid whatever comes next
(counted against them, one rejected first draft would keep out for a whole generation a drafter
whose tokens were accepted well on earlier prompts). A prompt's first tries of a source may
each lose only part of the room (``FIRST_TRY_SHARE``).

The balance counts each step at its estimated cost (after the step's own times have moved the
estimates), not at its measured time: one stalled step's measured time could spend a
generation's room on a draft the estimates say lost nothing. Where speculation pays
the balance grows and never binds; where verification is dear and drafts are poor (prose on an
AVX2 CPU) a generation loses at most that much, and the catch-ups its rate or room allowed,
against plain decoding, as far as the cost estimates are right.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from quickdraft.costs import CATCH_UP_HORIZON, RowOutlook, SequenceCosts, expected_tokens, step_cost, step_tokens

# Where a step's draft comes from: the decoder's drafter, or prompt lookup in front of it.
MODEL = "model"
LOOKUP = "lookup"
# Probes of a source come at the first pace again once one token from it is expected to be
# worth this share of a plain step: its acceptance is coming back.
PROBE_RESET = 0.9
# A generation's speculative steps may lose this share of its time against plain decoding, plus
# LOSS_SLACK plain steps (room for the first tries of each prompt), before it decodes plainly.
LOSS_BUDGET = 0.02
LOSS_SLACK = 1.0
# A prompt's first draft from a source (prompt lookup's first copy, the drafter's drafts until one
# of its tokens is accepted on this prompt) may lose at most this share of the room: what the
# drafter did on the last prompt says little about this one (a coding prompt's 0.8 acceptance
# drafted three tokens at a time on translation and qa, rejected, and spent the room of their
# 64-token generations), so a rejection leaves room for another try.
FIRST_TRY_SHARE = 0.5
# Acceptance assumed before any draft from a source was measured (``Acceptance``), by both
# policies. Low, and weighed as two positions: the first step's outcome replaces it, so it only
# decides the first steps. The batch's 0.5 rather than the single request's former 0.8: a high
# prior lets a loaded server draft for every row before anything is measured, while a single
# request's first step drafts the full K whatever the prior (``AdaptiveK.choose``).
PRIOR_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 2.0
# Weight of the past in the running acceptance, per step: about 5 steps, what 0.96 per drafted
# position keeps for one row drafting 5. Per step, not per position: a batch of 16 rows drafting
# 2 each would otherwise keep 0.38 of the past a step and swing with every step. Not longer: a
# single request whose drafter was shut out by a poor passage takes it back more slowly once it
# drafts well again (at 0.86, a few generations in eight took it back in half the steps or fewer:
# ``test_a_drafter_shut_out_by_a_poor_passage_is_probed_and_taken_back``).
ACCEPTANCE_DECAY = 0.8


@dataclass(frozen=True)
class Choice:
    """What one step drafts: ``k`` tokens from ``source`` (``MODEL`` with k = 0: plain decoding)."""

    source: str
    k: int


@dataclass(frozen=True)
class Decision:
    """What a batch's step drafts, as a ``BatchPolicy`` (``quickdraft.batch.policy``) chose it.

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


class SpeculationPolicy(Protocol):
    """Chooses each step's draft and learns from what the step did.

    ``adaptive``: whether it chooses k from what it measures (the server's batch then chooses
    by its measured costs too) or drafts K whatever they are (the batch then always drafts K).
    """

    adaptive: bool

    def begin(self) -> None:
        """A new generation starts (a new prompt)."""
        ...

    def choose(self, max_k: int, lookup_tokens: int = 0, catch_up: int = 0, remaining: int | None = None) -> Choice:
        """This step's draft: at most ``max_k`` tokens from the drafter, or the first k of the
        ``lookup_tokens`` that prompt lookup found (0: no match, or no lookup). Drafting from
        the drafter first reads ``catch_up`` positions (``Drafter.behind``); the generation may
        emit ``remaining`` more tokens (None: not known)."""
        ...

    def observe(self, source: str, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Record one step: its source, tokens drafted and accepted, and each phase's time."""
        ...

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        """Record a catch-up the step read before drafting (not in ``observe``'s draft time)."""
        ...


class Acceptance:
    """A running probability that a drafted token is accepted, over the last few steps: each
    step's tried positions weigh 1 each, and ``decay`` times less per step after theirs; the
    prior ``value`` weighs ``prior_weight`` positions (0: the first step's outcome replaces it).
    The first drafts' outcome thus replaces the prior within a step (a prior decaying like a full
    history of positions left the estimate near 0.5 after one client's first requests, and the
    server stopped drafting where drafts paid), and the estimate then spans about
    ``1 / (1 - decay)`` steps, however many rows each step drafts for. The one tracker of both
    policies: ``AdaptiveK`` keeps one per source, the batch engine one per source for the batch.

    ``add(rate, count)`` adds one step's ``count`` tried positions, whose mean acceptance is
    ``rate`` (weighed as ``count`` at once, in no order: the rejection that ends a step is not
    counted as the newest); ``tried`` counts them.
    """

    def __init__(self, value: float = PRIOR_ACCEPTANCE, decay: float = ACCEPTANCE_DECAY,
                 prior_weight: float = PRIOR_WEIGHT) -> None:
        self.value = value
        self.decay = decay
        self.tried = 0
        self._weight = prior_weight

    def add(self, rate: float, count: int) -> None:
        if count < 1:
            return
        self.tried += count
        kept = self.decay * self._weight
        self._weight = kept + count
        self.value = (kept * self.value + count * rate) / self._weight


class FixedK:
    """Always draft K tokens (fewer only near ``max_new_tokens``), from lookup when it has a match.

    One class for both interfaces: a ``SpeculationPolicy`` (``choose``, ``observe``) for one
    sequence, and a ``quickdraft.batch.policy.BatchPolicy`` (``decide``, ``observe_timings``,
    ``delivered``, ``observe_start_up``) where every row drafts ``RowOutlook.k(K)`` every step
    (``quickdraft serve --fixed-k``, tests). It learns nothing, so it observes nothing.
    """

    adaptive = False

    def __init__(self, k: int) -> None:
        self.max_k = self.k = k

    def begin(self) -> None:
        pass

    def choose(self, max_k: int, lookup_tokens: int = 0, catch_up: int = 0, remaining: int | None = None) -> Choice:
        if lookup_tokens:
            return Choice(LOOKUP, min(self.k, max_k, lookup_tokens))
        return Choice(MODEL, min(self.k, max_k))

    def decide(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        return Decision(self.k, tuple(row.k(self.k) for row in rows))

    def observe(self, source: str, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        pass

    def observe_timings(self, positions: int, verify_seconds: float, rows: int, draft_forwards: int,
                        draft_seconds: float) -> None:
        pass

    def delivered(self, seconds: float, tokens: int = 0, model_accepted: int = 0) -> None:
        pass

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        pass

    def observe_start_up(self, verify: Mapping[int, float], draft: Mapping[int, float]) -> None:
        pass


class ProbeSchedule:
    """When a way of drafting that is not paying is tried again (a probe): after ``every``
    steps without it, then after twice as many each time a probe finds it still not paying, up
    to ``most`` (where verification is dear, or a batch is large, a probe costs more than it
    finds); at the first pace again once it comes near paying (``near_paying``). A probe that
    costs ``cost`` plain steps more than a plain step is followed by at least ``cost / share``
    steps without one, whatever the pace (``probed``): probes then take at most ``share`` of
    the time.
    """

    def __init__(self, every: int, most: int) -> None:
        self.every = every
        self.most = most
        self.idle = 0  # steps since it last drafted
        self.wait = every  # steps without it before the next probe
        self._floor = 0  # the least wait the last probe's cost allows

    def step(self, used: bool) -> None:
        """Count one step that did (or did not) draft this way."""
        self.idle = 0 if used else self.idle + 1

    def due(self) -> bool:
        return self.idle >= self.wait

    def probed(self, cost: float = 0.0, share: float = 1.0) -> None:
        """A probe is drafted now, ``cost`` plain steps dearer than a plain step: the next waits
        twice as long (unless ``near_paying`` comes first), and at least ``cost / share`` steps."""
        self.idle = 0
        self._floor = math.ceil(cost / share)
        self.wait = max(min(2 * self.wait, self.most), self._floor)

    def charge(self, cost: float, share: float) -> None:
        """The last probe cost ``cost`` plain steps more than a plain step, as measured: the next
        waits at least ``cost / share`` steps, even where ``probed`` was told less beforehand."""
        self._floor = max(self._floor, math.ceil(cost / share))
        self.wait = max(self.wait, self._floor)

    def near_paying(self) -> None:
        self.wait = max(self.every, self._floor)

    def reset(self) -> None:
        self.idle, self.wait, self._floor = 0, self.every, 0


class LossBudget:
    """What exploring may cost: the balance of the steps it has seen, the plain-step time of the
    tokens they emitted minus what they cost (``record``), and the room a step may still lose,
    ``balance + share x time spent + slack plain steps`` (``room``). A guard of both policies
    (``AdaptiveK``: one per generation, ``reset`` at each; ``GoodputPolicy``: one for the batch's
    life, forgetting ``decay`` a step, so that what drafting gained long ago does not license
    a long loss now): a step may draft only what, even with every draft rejected, stays within
    the room, and a probe only what fits with its catch-up.

    A catch-up is paid whatever comes next: it counts as lost (``catch_up``), and is ``held``
    until a token from the drafter is accepted (``repaid``): then it is an investment the gain
    of the drafts to come repays, no longer a loss. Until then tries may also lose the room the
    catch-ups took (``room(plain) + held``): counted against them, one rejected first draft
    would keep out a drafter whose tokens were accepted well before.
    """

    def __init__(self, share: float = LOSS_BUDGET, slack: float = LOSS_SLACK, decay: float = 1.0) -> None:
        self.share = share
        self.slack = slack
        self.decay = decay
        self.balance = 0.0  # seconds saved against plain decoding (< 0: lost)
        self.spent = 0.0  # seconds of the steps counted
        self.held = 0.0  # seconds of catch-ups held against the balance until the next accepted token

    def reset(self) -> None:
        self.balance = self.spent = self.held = 0.0

    def room(self, plain: float) -> float:
        """Seconds the steps may still lose against plain decoding, one plain step costing ``plain``."""
        return self.balance + self.share * self.spent + self.slack * plain

    def record(self, worth: float, cost: float) -> None:
        """A step that cost ``cost`` seconds and emitted what plain steps would take ``worth`` to."""
        self._forget()
        self.balance += worth - cost
        self.spent += cost

    def catch_up(self, seconds: float) -> None:
        """A drafter's catch-up of ``seconds``: lost, and held until ``repaid``."""
        self.balance -= seconds
        self.spent += seconds
        self.held += seconds

    def repaid(self) -> None:
        """A token from the drafter was accepted: its catch-ups are no longer a loss."""
        self.balance += self.held
        self.held = 0.0

    def _forget(self) -> None:
        if self.decay < 1.0:
            self.balance *= self.decay
            self.spent *= self.decay
            self.held *= self.decay


class AdaptiveK:
    """Choose each step's source and k to maximise expected tokens per second.

    Args:
        max_k: the largest k ever drafted (the decoder's ``num_speculative_tokens``).
        prior_acceptance: acceptance assumed for a source before anything is measured
            (``Acceptance``, which tracks each source's acceptance).
        costs: the step costs it learns (default: ``SequenceCosts()``, each count's first
            verification dropped).
        acceptance_decay: ``Acceptance.decay``.
        probe_every: a source (the drafter, prompt lookup) not chosen for this many steps drafts
            one token, so that a change in its acceptance (a new prompt, a copy-heavy passage)
            is noticed; each probe that does not come near paying doubles that source's wait,
            up to ``max_probe_every``, since where verification is dear a probe costs more than
            it finds.

    It first tries the full K and plain decoding once each, to measure both ends of the
    verification cost; from then on every choice is a comparison of measured rates, with plain
    decoding (k = 0) always among them.

    The estimates persist across generations of the same decoder: a server or benchmark
    learns its workload and its machine; a new prompt moves them within a few steps.
    """

    adaptive = True

    def __init__(
        self,
        max_k: int,
        prior_acceptance: float = PRIOR_ACCEPTANCE,
        costs: SequenceCosts | None = None,
        acceptance_decay: float = ACCEPTANCE_DECAY,
        probe_every: int = 8,
        max_probe_every: int = 64,
    ) -> None:
        self.max_k = max_k
        self.probe_every = probe_every
        self.max_probe_every = max_probe_every
        self.costs = costs if costs is not None else SequenceCosts()
        self._prior = prior_acceptance
        self._acceptance_decay = acceptance_decay
        self._accept: dict[str, Acceptance] = {}
        self._probes = {source: ProbeSchedule(probe_every, max_probe_every) for source in (MODEL, LOOKUP)}
        self.budget = LossBudget()  # this generation's
        self._model_accepted = False  # a token from the drafter was accepted in this generation

    def begin(self) -> None:
        """Forget prompt lookup's acceptance: how well the text copies itself is a property of
        the prompt (code and quoted documents copy, prose matches common words by chance), so
        each prompt's copies are judged afresh. The drafter's acceptance and every cost carry
        over: they belong to the pair and the machine, but until one of its tokens is accepted on
        this prompt its drafts are first tries (``FIRST_TRY_SHARE``), and each source is probed
        at the first pace again: a drafter whose acceptance fell on one kind of prompt, its
        waits grown there, would otherwise not be probed in a whole generation of another kind
        where it drafts well. The loss budget starts afresh."""
        self._accept.pop(LOOKUP, None)
        for probes in self._probes.values():
            probes.reset()
        self.budget.reset()
        self._model_accepted = False

    def acceptance(self, source: str = MODEL) -> float:
        """Current estimate of the probability that a token drafted by ``source`` is accepted."""
        return self._accept[source].value if source in self._accept else self._prior

    def expected_tokens(self, k: int, source: str = MODEL) -> float:
        """E(k) for ``source``: tokens a step drafting k from it is expected to emit."""
        return expected_tokens(self.acceptance(source), k)

    def rate(self, source: str, k: int, catch_up: int = 0, remaining: int | None = None) -> float | None:
        """Expected tokens per second of a step drafting k from ``source`` (``None``: unmeasured):
        ``step_tokens`` over ``step_cost`` of the one row, with its share of a catch-up of
        ``catch_up`` positions over the ``remaining`` tokens it serves (``choose``)."""
        row = [self._row(source, k, catch_up, remaining)]
        cost = step_cost(row, k, self.costs)
        # The floor: a clock can read 0 for a tiny model's step, and extrapolation can reach 0.
        return None if cost is None else step_tokens(row, k) / max(cost, 1e-9)

    def _row(self, source: str, k: int, catch_up: int = 0, remaining: int | None = None) -> RowOutlook:
        """The sequence as the one row of a step drafting k from ``source``; its catch-up serves
        at most ``CATCH_UP_HORIZON`` tokens (``RowOutlook.remaining``)."""
        model = source == MODEL
        return RowOutlook(cap=k, acceptance=self.acceptance(source), model=model,
                          behind=catch_up if model else 0, remaining=remaining or CATCH_UP_HORIZON)

    def choose(self, max_k: int, lookup_tokens: int = 0, catch_up: int = 0, remaining: int | None = None) -> Choice:
        max_k = min(max_k, self.max_k)
        lookup_tokens = min(lookup_tokens, max_k)
        if max_k < 1:
            return Choice(MODEL, 0)
        # Measure both ends of the cost curve first: a full draft, then a plain step.
        if not any(self.costs.measured(1 + k) for k in range(1, max_k + 1)):
            return Choice(LOOKUP, lookup_tokens) if lookup_tokens else Choice(MODEL, max_k)
        if not self.costs.measured(1):
            return Choice(MODEL, 0)
        # Tries may also lose the room the drafter's catch-ups took: those are paid whatever
        # comes next, and given back at its first accepted token. A new catch-up must fit.
        room = self.loss_room() + self.budget.held
        # The drafter's catch-up, in seconds (0 until one has been timed: then it is measured).
        lag = self.costs.catch_up(catch_up) or 0.0

        def fits(source: str, k: int) -> bool:  # even with every draft rejected, within the budget
            share = 1.0 if source != MODEL or self._model_accepted else FIRST_TRY_SHARE
            return k == 0 or self.worst_loss(source, k) <= share * room

        def probe_fits(source: str, k: int) -> bool:  # a probe's catch-up is not repaid by a gain
            return k == 0 or self.worst_loss(source, k) + (lag if source == MODEL else 0.0) <= room

        if lookup_tokens and LOOKUP not in self._accept:
            # This prompt's first lookup draft measures how well it copies itself: as long as it
            # loses at most its share of the budget's room, the rest kept for the drafter.
            first = max((k for k in range(1, lookup_tokens + 1)
                         if self.worst_loss(LOOKUP, k) <= FIRST_TRY_SHARE * room), default=0)
            if first:
                return Choice(LOOKUP, first)
        candidates = [c for c in [(MODEL, k) for k in range(max_k + 1)] + [(LOOKUP, k) for k in range(1, lookup_tokens + 1)]
                      if fits(*c)]
        rates = {c: self.rate(*c, catch_up, remaining) for c in candidates}
        if rates.get((MODEL, 1), 0.0) is None:  # the model has not drafted yet: its longest draft that fits
            return Choice(MODEL, max(k for source, k in candidates if source == MODEL))
        best = max((c for c in candidates if rates[c] is not None), key=lambda c: (rates[c], c[0] == LOOKUP, -c[1]))
        return self._probe_or(Choice(*best), lookup_tokens, probe_fits)

    def loss_room(self) -> float:
        """Seconds this generation's speculation may still lose against plain decoding (see above;
        the catch-ups ``held`` aside)."""
        return self.budget.room(self.costs.verify(1) or 0.0)

    def worst_loss(self, source: str, k: int) -> float:
        """Seconds a step drafting k from ``source`` loses against a plain step if it emits one
        token (a draft cost not measured yet counts as free)."""
        drafting = self.estimated_cost(source, k)
        if drafting is None:
            drafting = self.costs.verify(1 + k) or 0.0
        return drafting - (self.costs.verify(1) or 0.0)

    def estimated_cost(self, source: str, drafted: int) -> float | None:
        """Seconds of a step drafting ``drafted`` from ``source``, from the cost estimates
        (``step_cost`` of the one row, without a catch-up; ``None``: a cost not measured yet)."""
        return step_cost([self._row(source, drafted)], drafted, self.costs, catch_up=False)

    def _probe_or(self, best: Choice, lookup_tokens: int, fits: Callable[[str, int], bool]) -> Choice:
        """``best``, unless a source has gone unused for its wait: then one token from it (once
        the loss budget ``fits`` it), so that an estimate from one poor passage does not shut a
        drafter out for good (a new prompt, a copy-heavy passage). Each probe doubles that
        source's wait, up to ``max_probe_every``, until it comes near paying again (``observe``)."""
        for source, probes in self._probes.items():
            probes.step(used=best.k > 0 and best.source == source)
        for source, probes in self._probes.items():
            if (source == MODEL or lookup_tokens) and probes.due() and fits(source, 1):
                probes.probed()
                return Choice(source, 1)
        return best

    def observe(self, source: str, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        # One draft forward per drafted token from the drafter; prompt lookup's copy is free.
        self.costs.observe(1 + drafted, verify_seconds, 1, drafted if source == MODEL else 0, draft_seconds)
        # The budget's balance, from the cost estimates this step has just moved: its own times
        # against them are mostly the host's noise (see above).
        cost = self.estimated_cost(source, drafted)
        plain = self.costs.verify(1)
        if cost is not None and plain is not None:
            self.budget.record((min(accepted, drafted) + 1) * plain, cost)
        if drafted == 0:
            return
        if source == MODEL and accepted:
            # The catch-ups served a draft that was accepted: an investment the gain of the
            # drafts to come repays (as ``rate`` counts it), no longer a loss.
            self.budget.repaid()
            self._model_accepted = True
        # A prompt's lookup copies are judged on their own record from the first (begin); the
        # drafter starts from the prior.
        accept = self._accept.setdefault(source, Acceptance(
            self._prior, self._acceptance_decay, prior_weight=0.0 if source == LOOKUP else PRIOR_WEIGHT))
        # Position i was tried iff positions < i were accepted: i = 0..accepted (capped).
        tried = min(accepted + 1, drafted)
        accept.add(accepted / tried, count=tried)
        # Probe at the first pace again once a draft comes near paying: acceptance is climbing.
        near, plain = self.rate(source, 1), self.rate(MODEL, 0)
        if near is not None and plain is not None and near > PROBE_RESET * plain:
            self._probes[source].near_paying()

    def observe_catch_up(self, positions: int, seconds: float) -> None:
        if positions < 1:
            return
        self.costs.observe_catch_up(positions, seconds)
        self.budget.catch_up(seconds)

"""The drafter Protocol: what the decoding loop needs from anything that proposes tokens."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from quickdraft.config import SamplingParams
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import greedy, logits_to_probs, sample
from quickdraft.tree import node_depths


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for the next positions, and the distribution each was drawn from.

    A chain (``parents is None``) proposes one token per position; a tree proposes several
    candidates per position (see ``quickdraft.tree``): node ``i`` continues node ``parents[i]``.

    Attributes:
        tokens: ``[k]`` int64 proposed tokens, ``0 <= k <=`` the number asked for; a tree's
            ``[N]`` node tokens, at most k deep.
        probs: ``[k, V]`` float32 ``q`` for each token (after the sampling parameters), or
            ``None`` when the drafter has no distribution (one-hot ``q``) or decoding is greedy.
            In a tree, row ``i`` is the distribution node ``i`` was drawn from (its parent's
            ``q``), and ``None`` means deterministic nodes (top tokens, n-gram branches).
        parents: ``None`` for a chain; for a tree ``[N]`` int64 parent of each node,
            ``parents[i] < i``, -1 for the root's children (the root is the sequence's last token).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    parents: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> int:
        """Positions drafted past the sequence: k for a chain, the deepest node's depth for a tree."""
        if self.parents is None:
            return len(self)
        return max(node_depths(self.parents.tolist()), default=0)  # host sync: tiny, once a step


def draw(
    logits: torch.Tensor, drafted: list[int], params: SamplingParams, generator: torch.Generator | None,
    processor: LogitsProcessor,
) -> tuple[int, torch.Tensor | None]:
    """Draw a chain's next draft token from ``[V]`` logits that follow the ``drafted`` tokens.

    Returns the token and ``q`` (``[V]``, the distribution it was drawn from; None if greedy).
    One host sync: the next draft forward needs the id.
    """
    logits = processor(logits[None], drafted, rows=[len(drafted) - 1])[0]  # [V]
    if params.greedy:
        return int(greedy(logits).item()), None
    q = logits_to_probs(logits, params)  # [V]
    return int(sample(q, generator).item()), q


@dataclass(frozen=True)
class Footprint:
    """What a drafter holds beside the target, for the server's memory budget and the policy.

    Attributes:
        weight_bytes: its own weights (a draft model's, a trained head's); 0 for prompt lookup.
            The target's layers a head reuses are not counted again.
        cache_bytes_per_token: what it holds per token of a sequence: a draft model's KV cache,
            a head's KV cache and the target's feature kept for it.
        context_length: the longest sequence it reads (a draft model's window), None: no limit.
        note: one line on what it is, for the server's startup log.
    """

    weight_bytes: int = 0
    cache_bytes_per_token: int = 0
    context_length: int | None = None
    note: str = ""


NO_FOOTPRINT = Footprint()


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for the sequence being decoded.

    ``begin`` is called once per generation with the prompt; ``propose`` once per step with the
    whole sequence so far (prompt + accepted tokens). A drafter with state (a KV cache) syncs
    itself to the sequence it is given, which is how rejected drafts are undone.

    ``processor`` applies the options that depend on the prefix (penalties, logit bias,
    structured output; ``quickdraft.processing``) to a row of drafted logits, as the loop applies
    them to the target's: a drafter that passes its logits through it drafts from the q that
    plain decoding's p resembles most. Ignoring it is still exact (q only has to be the
    distribution each token was drawn from), just accepted less often.

    What the loop and the server need to know of a drafter is asked here, never probed:
    ``needs_target_features`` (then ``observe_target`` comes before every ``propose``),
    ``footprint`` (memory, context window), ``free_draft`` (a copy offered before the
    drafter runs: prompt lookup in front, ``drafters.lookup_first``) and ``behind`` (what it
    would read before drafting). ``DrafterBase`` gives the defaults of a drafter that has none
    of these.
    """

    name: str
    needs_target_features: bool

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft: ...

    @property
    def forwards(self) -> int:
        """Model forward passes run since ``begin`` (0 for model-free drafters)."""
        ...

    @property
    def positions(self) -> int:
        """Token positions processed by those forwards."""
        ...

    def observe_target(self, features: torch.Tensor) -> None:
        """Take the target's features of the sequence about to be passed to ``propose``
        (only called when ``needs_target_features``).

        Args:
            features: ``[L - 1, H]`` the target's last-layer hidden state at each token of the
                sequence but the last (which the target has not seen yet: it is fed with the
                drafts). A view into the target's buffer, valid until the next target forward.
        """
        ...

    def free_draft(self, sequence: Sequence[int], k: int) -> Draft:
        """Up to ``k`` tokens on offer for free before ``propose`` runs (one-hot ``q``, a chain);
        empty when there are none. The policy weighs them against ``propose``'s k."""
        ...

    def behind(self, sequence: Sequence[int]) -> int:
        """Positions of ``sequence`` the drafter must read before its next ``propose`` beyond
        what a step reads anyway (a draft model that has not read the prompt yet); 0 for none.
        The policy weighs that reading against what drafting would gain."""
        ...

    def catch_up(self, sequence: Sequence[int]) -> None:
        """Read what ``behind`` counts now, so that the next ``propose`` costs a step's drafting only."""
        ...

    def footprint(self) -> Footprint: ...


class DrafterBase:
    """Defaults for a drafter: no target features, no free drafts, nothing to catch up on, no
    memory of its own, no model forwards. A drafter subclasses it and writes ``name``, ``begin``
    and ``propose``."""

    name = "drafter"
    needs_target_features = False
    forwards = 0
    positions = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Stateless by default: every proposal reads the sequence it is given."""

    def observe_target(self, features: torch.Tensor) -> None:
        raise NotImplementedError(f"{self.name} does not draft from the target's features")

    def free_draft(self, sequence: Sequence[int], k: int) -> Draft:
        return Draft(tokens=torch.empty(0, dtype=torch.long))

    def behind(self, sequence: Sequence[int]) -> int:
        return 0

    def catch_up(self, sequence: Sequence[int]) -> None:
        """Nothing to read: ``behind`` is 0."""

    def footprint(self) -> Footprint:
        return NO_FOOTPRINT

    def fork(self) -> Drafter:
        """A drafter for another sequence decoded at the same time (a row of the batched engine),
        sharing this one's weights and tables. By default this very drafter: the rows then take
        turns, and ``begin`` runs again whenever the row changes (``RowDrafters``), which is
        exact for any drafter that keeps the Protocol's promise to sync to the sequence given.
        A drafter with a cache overrides it so that each row keeps its own."""
        return self


@dataclass
class RowAsk:
    """One row's part of a batched draft: what ``Drafter.propose`` takes, for row ``row``.

    Attributes:
        features: ``[L - 1, H]`` the target's features of the sequence but its last token, for
            a drafter that ``needs_target_features``; None otherwise.
    """

    row: int
    sequence: Sequence[int]
    k: int
    params: SamplingParams
    generator: torch.Generator | None
    processor: LogitsProcessor
    features: torch.Tensor | None = None


@dataclass(frozen=True)
class RowsDrafted:
    """What a batched draft returned.

    Attributes:
        drafts: each ask's chain, in the order of the asks.
        forwards: the draft forwards its drafting ran, catch-ups aside (the policy prices a
            step's drafting as that many forwards over the rows that drafted).
        seconds: their time, draws included.
        counts: per ask, the forwards and positions run for that row (statistics).
        catch_ups: positions and seconds of each forward that read what rows were behind on.
    """

    drafts: list[Draft]
    forwards: int
    seconds: float
    counts: list[tuple[int, int]]
    catch_ups: list[tuple[int, float]] = field(default_factory=list)


class RowDrafters:
    """Any ``Drafter`` drafting for the rows of a batch: each row has its own ``fork`` of it,
    begun with that row's prompt, and the rows draft in turn (one ``propose`` each).

    A fork that is the drafter itself (the default) is shared: it is begun again with a row's
    prompt whenever the previous proposal was another row's. A tree (``Draft.parents``) is cut
    to its first branch, which is a chain drawn as the tree drew it: the batched engine
    verifies chains. Rows are numbered as the engine's: the last row takes a removed row's index.
    """

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.name = drafter.name
        self.needs_target_features = drafter.needs_target_features
        self.context_length = drafter.footprint().context_length
        self._rows: list[tuple[Drafter, list[int], int]] = []  # per row: its fork, its prompt, a serial
        self._serial = 0
        self._begun: dict[int, int] = {}  # id(fork) -> the serial of the row it was last begun for

    def add_row(self, prompt_ids: Sequence[int], others: Sequence[Sequence[int]] = ()) -> None:
        fork = fork_of(self.drafter)
        fork.begin(prompt_ids)
        self._rows.append((fork, list(prompt_ids), self._serial))
        self._begun[id(fork)] = self._serial
        self._serial += 1

    def remove_row(self, index: int) -> None:
        last = self._rows.pop()
        if index < len(self._rows):
            self._rows[index] = last

    def shrink(self, slots: int) -> None:
        """Nothing to shrink: each fork holds its own."""

    def view(self, index: int, sequence: Sequence[int]) -> Sequence[int]:
        return sequence

    def commit(self, index: int, sequence: Sequence[int]) -> None:
        """Nothing to roll back: each fork syncs to the sequence its next ``propose`` is given."""

    def cache_bytes(self, positions: int) -> int:
        return self.drafter.footprint().cache_bytes_per_token * positions

    @property
    def bytes_per_slot(self) -> int:
        return self.drafter.footprint().cache_bytes_per_token

    def start_up_timings(self) -> None:
        """None: the rows' drafting is timed by the steps."""
        return None

    def prompt_to_read(self, index: int) -> int:
        """0: a fork reads its row within its drafting, which the steps time."""
        return 0

    def behind(self, index: int, view: Sequence[int], reading: object = None) -> int:
        return 0

    def propose_rows(self, asks: Sequence[RowAsk]) -> RowsDrafted:
        """Each ask's chain (``ask.row``: the row's index), on the drafter's device. ``forwards``
        is the most tokens a row drafted: the rows draft in turn, so a step's drafting costs
        about that many forwards over all of them."""
        start = time.perf_counter()
        drafts, counts = [], []
        for ask in asks:
            fork, prompt, serial = self._rows[ask.row]
            if self._begun.get(id(fork)) != serial:
                fork.begin(prompt)
                self._begun[id(fork)] = serial
            if ask.features is not None:
                fork.observe_target(ask.features)
            forwards, positions = fork.forwards, fork.positions
            draft = first_branch(fork.propose(ask.sequence, ask.k, ask.params, ask.generator, ask.processor))
            drafts.append(Draft(tokens=draft.tokens[: ask.k], probs=None if draft.probs is None else draft.probs[: ask.k]))
            counts.append((max(0, fork.forwards - forwards), max(0, fork.positions - positions)))
        return RowsDrafted(drafts, max((ask.k for ask in asks), default=0), time.perf_counter() - start, counts)

    def footprint(self) -> Footprint:
        return self.drafter.footprint()


def fork_of(drafter: Drafter) -> Drafter:
    """``drafter.fork()``; a drafter written to the bare Protocol, without ``DrafterBase``, has
    none and is shared by the rows (``DrafterBase.fork``)."""
    method = getattr(drafter, "fork", None)
    return drafter if method is None else method()


def first_branch(draft: Draft) -> Draft:
    """A chain of ``draft``: itself, or a tree's first branch (node 0, then each node's first
    child). Each node's ``q`` row is the distribution it was drawn from, so the branch is a
    chain drawn from those."""
    if draft.parents is None:
        return draft
    parents = draft.parents.tolist()  # host sync: tiny, once a row's step
    path: list[int] = []
    for node, parent in enumerate(parents):
        if parent == (path[-1] if path else -1):
            path.append(node)
    index = torch.tensor(path, dtype=torch.long, device=draft.tokens.device)
    return Draft(tokens=draft.tokens[index], probs=None if draft.probs is None else draft.probs[index])

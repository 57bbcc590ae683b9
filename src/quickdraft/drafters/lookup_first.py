"""Prompt lookup in front of any drafter: a free copy when the context has one, else the drafter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, Footprint, fork_of
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.processing import LogitsProcessor


class Lookup(Protocol):
    """What stands in front of a drafter: free chains (one-hot q) from text already seen.
    ``PromptLookupDrafter`` (the request's own text) and ``SuffixDrafter`` (earlier requests'
    too) are lookups."""

    def chain(self, sequence: Sequence[int], k: int) -> Draft: ...

    def chain_ids(self, sequence: Sequence[int], k: int) -> list[int]: ...

    def fork(self, scope: str | None = None) -> Lookup:
        """The lookup of another request, drafting only from text of ``scope`` (None: this one's)."""
        ...

    def sync(self, sequence: Sequence[int]) -> None:
        """The request's sequence now (prompt and accepted tokens), as it grows."""
        ...


class PromptLookupFirst:
    """``drafter`` with prompt lookup's chain on offer before it (``free_draft``).

    Where the sequence's last n-gram occurred before, the tokens that followed it cost nothing
    to draft; the policy weighs that copy against ``drafter``'s k tokens (and against plain
    decoding), learning each source's acceptance apart. Everything else is ``drafter``'s.

    Args:
        drafter: the drafter behind the lookup (a draft model, a head, a custom drafter).
        lookup: what drafts the free copy (``PromptLookupDrafter``'s defaults if not given;
            ``SuffixDrafter`` adds earlier requests' text).
    """

    def __init__(self, drafter: Drafter, lookup: Lookup | None = None) -> None:
        self.inner = drafter
        self.lookup = lookup or PromptLookupDrafter()
        self.name = drafter.name
        self.needs_target_features = drafter.needs_target_features

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    @property
    def positions(self) -> int:
        return self.inner.positions

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.inner.begin(prompt_ids)

    def observe_target(self, features: torch.Tensor) -> None:
        self.inner.observe_target(features)

    def free_draft(self, sequence: Sequence[int], k: int) -> Draft:
        return self.lookup.chain(sequence, k)

    def behind(self, sequence: Sequence[int]) -> int:
        return self.inner.behind(sequence)

    def catch_up(self, sequence: Sequence[int]) -> None:
        self.inner.catch_up(sequence)

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        return self.inner.propose(sequence, k, params, generator, processor)

    def footprint(self) -> Footprint:
        return self.inner.footprint()

    def fork(self) -> PromptLookupFirst:
        return PromptLookupFirst(fork_of(self.inner), self.lookup.fork())

"""The drafter Protocol: what the decoding loop needs from anything that proposes tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from quickdraft.config import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for the next positions, and the distribution each was drawn from.

    Attributes:
        tokens: ``[k]`` int64 proposed tokens, ``0 <= k <=`` the number asked for.
        probs: ``[k, V]`` float32 ``q`` for each token (after the sampling parameters), or
            ``None`` when the drafter has no distribution (one-hot ``q``) or decoding is greedy.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for the sequence being decoded.

    ``begin`` is called once per generation with the prompt; ``propose`` once per step with the
    whole sequence so far (prompt + accepted tokens). A drafter with state (a KV cache) syncs
    itself to the sequence it is given, which is how rejected drafts are undone.
    """

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft: ...

    @property
    def forwards(self) -> int:
        """Model forward passes run since ``begin`` (0 for model-free drafters)."""
        ...

    @property
    def positions(self) -> int:
        """Token positions processed by those forwards."""
        ...

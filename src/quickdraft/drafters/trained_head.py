"""What the drafters of trained heads (EAGLE, Medusa) share: the target's features and its
output layer over the vocabulary the head drafts over."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from quickdraft.drafters.base import DrafterBase, Footprint
from quickdraft.drafters.vocabulary import HeadOutput
from quickdraft.memory import module_bytes
from quickdraft.models.base import LoadedModel


class TrainedHeadDrafter(DrafterBase):
    """Base of ``EagleDrafter`` and ``MedusaDrafter``: they draft from the target's features.

    Args:
        head: the trained head, on the target's device and in its dtype; it has a
            ``vocabulary_size`` (the token ids it was trained over, ``None``: all).
        target: the target it was trained for: its output layer is used.
        name: the drafter's name in statistics and reports.
        note: what the head reuses of the target, for the server's log.
        head_cache_bytes_per_token: the head's own KV cache per token (0: it has none).
    """

    needs_target_features = True

    def __init__(self, head: nn.Module, target: LoadedModel, name: str, note: str,
                 head_cache_bytes_per_token: int = 0) -> None:
        self.head = head
        self.target = target
        self.name = name
        self.forwards = 0
        self.positions = 0
        self._output = HeadOutput(target, head.vocabulary_size)
        self._features: torch.Tensor | None = None  # [L - 1, H] the target's, from observe_target
        # Per token: the target's feature kept for the head (hidden size x element size), and
        # the head's own cache.
        feature_bytes = target.module.config.get_text_config().hidden_size * target.dtype.itemsize
        self._footprint = Footprint(module_bytes(head), feature_bytes + head_cache_bytes_per_token, note=note)

    def footprint(self) -> Footprint:
        return self._footprint

    def fork(self) -> TrainedHeadDrafter:
        """The same head with an output vocabulary and features of its own (``begin`` sets them)."""
        twin = copy.copy(self)
        twin._output = HeadOutput(self.target, self.head.vocabulary_size)
        twin._features = None
        return twin

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Reset the counts and choose the vocabulary drafted over for this prompt."""
        self.forwards = self.positions = 0
        self._output.begin(prompt_ids)

    def observe_target(self, features: torch.Tensor) -> None:
        self._features = features

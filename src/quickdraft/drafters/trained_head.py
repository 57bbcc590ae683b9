"""What the drafters of trained heads (EAGLE, Medusa) share: the target's features and its
output layer over the vocabulary the head drafts over."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from quickdraft.drafters.vocabulary import HeadOutput
from quickdraft.models.base import LoadedModel


class TrainedHeadDrafter:
    """Base of ``EagleDrafter`` and ``MedusaDrafter`` (a ``FeatureDrafter``).

    Args:
        head: the trained head, on the target's device and in its dtype; it has a
            ``vocabulary_size`` (the token ids it was trained over, ``None``: all).
        target: the target it was trained for: its output layer is used.
        name: the drafter's name in statistics and reports.
    """

    def __init__(self, head: nn.Module, target: LoadedModel, name: str) -> None:
        self.head = head
        self.target = target
        self.name = name
        self.forwards = 0
        self.positions = 0
        self._output = HeadOutput(target, head.vocabulary_size)
        self._features: torch.Tensor | None = None  # [L - 1, H] the target's, from observe_target

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Reset the counts and choose the vocabulary drafted over for this prompt."""
        self.forwards = self.positions = 0
        self._output.begin(prompt_ids)

    def observe_target(self, features: torch.Tensor) -> None:
        self._features = features

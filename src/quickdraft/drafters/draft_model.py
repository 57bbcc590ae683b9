"""Drafting with a smaller model that shares the target's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.models.base import LoadedModel
from quickdraft.runner import ModelRunner
from quickdraft.sampling import greedy, logits_to_probs, sample


class DraftModelDrafter:
    """Runs the draft model autoregressively for k tokens, one forward per token.

    Its cache holds the sequence up to (not including) the last token. After a step whose k
    drafts were all accepted, the cache lacks the last draft token as well; ``propose`` feeds
    both in one forward, so the draft never skips a position.

    Args:
        model: the draft model (same vocabulary as the target).
        vocabulary_size: if set, the draft proposes only the ``vocabulary_size`` most frequent
            tokens, the prompt's own tokens and the special tokens
            (``quickdraft.drafters.vocabulary``), and computes only those rows of its output
            layer.
    """

    def __init__(self, model: LoadedModel, vocabulary_size: int | None = None) -> None:
        self.model = model
        self.name = f"draft:{model.name}"
        self.vocabulary_size = vocabulary_size
        self._runner = ModelRunner(model)

    @property
    def forwards(self) -> int:
        return self._runner.forwards

    @property
    def positions(self) -> int:
        return self._runner.positions

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._runner.reset()
        self._runner.restrict_vocabulary(draft_vocabulary(self.model, self.vocabulary_size, prompt_ids))
        if len(prompt_ids) > 1:
            self._runner.forward(prompt_ids[:-1])

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        logits = self._runner.forward_tail(sequence)[-1]  # [V]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if params.greedy:
                token = greedy(logits)
            else:
                q = logits_to_probs(logits, params)  # [V]
                token = sample(q, generator)
                probs.append(q)
            tokens.append(int(token.item()))  # host sync: the next forward needs the id
            if i < k - 1:
                logits = self._runner.forward(tokens[-1:])[-1]
        device = self.model.device
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            probs=torch.stack(probs) if probs else None,
        )

"""Drafting with a smaller model that shares the target's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, draw
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.runner import ModelRunner


def begin_draft_runner(
    runner: ModelRunner, vocabulary_size: int | None, context_window: int | None, prompt_ids: Sequence[int]
) -> int:
    """Reset a draft model's runner for a new prompt and prefill it; returns where its view of
    the sequence starts (0, or the first of the prompt's last ``context_window`` tokens).

    Drafting from a window of the prompt is still exact: the target verifies against whatever
    distribution the draft drew from. It saves the draft's prefill of a long prompt (a third of
    the target's on the demo pair), which is paid before the first token; prompt lookup still
    sees the whole prompt.
    """
    runner.reset()
    runner.restrict_vocabulary(draft_vocabulary(runner.model, vocabulary_size, prompt_ids))
    start = max(0, len(prompt_ids) - context_window) if context_window is not None else 0
    if len(prompt_ids) - start > 1:
        runner.forward(prompt_ids[start:-1])
    return start


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
        context_window: if set, the draft sees only the prompt's last ``context_window``
            tokens (and everything generated after them); see ``begin_draft_runner``.
    """

    def __init__(self, model: LoadedModel, vocabulary_size: int | None = None,
                 context_window: int | None = None) -> None:
        self.model = model
        self.name = f"draft:{model.name}"
        self.vocabulary_size = vocabulary_size
        self.context_window = context_window
        self._runner = ModelRunner(model)
        self._start = 0  # the sequence's first position the draft sees

    @property
    def forwards(self) -> int:
        return self._runner.forwards

    @property
    def positions(self) -> int:
        return self._runner.positions

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._start = begin_draft_runner(self._runner, self.vocabulary_size, self.context_window, prompt_ids)

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        logits = self._runner.forward_tail(sequence[self._start:])[-1]  # [V]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            token, q = draw(logits, tokens, params, generator, processor)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if i < k - 1:
                logits = self._runner.forward(tokens[-1:])[-1]
        device = self.model.device
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            probs=torch.stack(probs) if probs else None,
        )

"""The token ids a draft may propose when it drafts over a restricted vocabulary (FR-Spec), and
the target's output layer cut to them, which trained heads draft with."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.models.base import LoadedModel
from quickdraft.runner import OutputRows


def draft_vocabulary(model: LoadedModel, size: int | None, prompt_ids: Sequence[int]) -> torch.Tensor | None:
    """``[R]`` sorted token ids a draft proposes for this prompt, or None for the whole vocabulary.

    The ``size`` lowest ids (byte-pair vocabularies number their tokens roughly by frequency),
    the special tokens and the prompt's own tokens (names and literals the continuation is
    likely to repeat). Drafting over a subset is still lossless: q is whatever distribution
    the draft sampled from; only the acceptance of rare tokens is lost.
    """
    if size is None or size >= model.vocab_size:
        return None
    frequent = torch.arange(size)
    special = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long)
    if model.tokenizer is not None:
        special = torch.cat([special, torch.tensor(model.tokenizer.all_special_ids, dtype=torch.long)])
    prompt = torch.tensor(list(prompt_ids), dtype=torch.long)
    return torch.unique(torch.cat([frequent, special, prompt]))


class HeadOutput:
    """The target's output layer as a trained head (EAGLE, Medusa) drafts with it: over the
    ``vocabulary_size`` most frequent tokens the head was trained on (``draft_vocabulary``),
    chosen again for every prompt by ``begin``."""

    def __init__(self, target: LoadedModel, vocabulary_size: int | None) -> None:
        self.target = target
        self.vocabulary_size = vocabulary_size
        self.layer = target.module.get_output_embeddings()
        self.weight = self.layer.weight  # [V, H]
        self._rows: OutputRows | None = None  # None: all token ids

    def begin(self, prompt_ids: Sequence[int]) -> None:
        rows = draft_vocabulary(self.target, self.vocabulary_size, prompt_ids)
        self._rows = None if rows is None else OutputRows(self.weight, rows, self.weight.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` logits of predicted features (``[n, H]``); -inf outside the vocabulary drafted over."""
        return self.layer(hidden) if self._rows is None else self._rows.logits(hidden)


class BatchOutputRows:
    """The draft vocabularies of a batch's rows (``draft_vocabulary`` of each row's prompt), as a
    draft model's output layer computes them for all rows at once: the ``size`` most frequent
    and the special tokens are one ``OutputRows`` shared by every row; the few prompt tokens
    outside them are computed for their own row only.

    Args:
        model: the draft model.
        size: how many of its most frequent tokens every row drafts over.
    """

    def __init__(self, model: LoadedModel, size: int) -> None:
        self.weight = model.module.get_output_embeddings().weight  # [V, H]
        shared = draft_vocabulary(model, size, [])  # [R]
        self.shared = OutputRows(self.weight, shared, model.vocab_size)
        self._is_shared = torch.zeros(model.vocab_size, dtype=torch.bool)  # [V]
        self._is_shared[shared] = True

    def own_rows(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """``[E]`` the token ids a row with this prompt drafts over beyond the shared ones."""
        ids = torch.unique(torch.tensor(list(prompt_ids), dtype=torch.long))
        return ids[~self._is_shared[ids]]

    def logits(self, hidden: torch.Tensor, own_rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[n, V]`` logits of ``hidden`` (``[n, H]``), position ``i`` in the vocabulary of the row
        whose ``own_rows`` result is ``own_rows[i]``; -inf outside it."""
        logits = self.shared.logits(hidden)
        for i, ids in enumerate(own_rows):
            if len(ids):
                logits[i, ids] = self.shared.product(hidden[i : i + 1], self.weight[ids])[0]
        return logits

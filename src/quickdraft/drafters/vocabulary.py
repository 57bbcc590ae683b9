"""The token ids a draft model may propose when it drafts over a restricted vocabulary (FR-Spec)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.models.base import LoadedModel


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

"""Prompt lookup: propose the tokens that followed the latest earlier match of the last n-gram."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.errors import InvalidParameterError
from quickdraft.processing import LogitsProcessor


class PromptLookupDrafter:
    """N-gram matching in the prompt and the text generated so far; no model, one-hot q.

    The last ``n`` tokens (``n`` from ``max_ngram`` down to ``min_ngram``) are searched for in
    the earlier sequence; the most recent match wins, and the tokens that followed it are the
    draft. Example with ``max_ngram=2``: sequence ``a b c d a b`` ends in ``a b``, which also
    occurs at position 0, followed by ``c d a b``: the draft for k=3 is ``c d a``.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    forwards = 0
    positions = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Stateless: every proposal searches the sequence it is given."""

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor | None = None,
    ) -> Draft:
        seq = torch.tensor(sequence, dtype=torch.long)  # [L]
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            # windows[i] = seq[i : i + n]; the last window is the suffix itself, so skip it.
            windows = seq.unfold(0, n, 1)[:-1]  # [L - n, n]
            hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()  # host sync: search result
            if hits.numel():
                start = int(hits[-1]) + n
                return Draft(tokens=seq[start : start + k].clone())
        return Draft(tokens=torch.empty(0, dtype=torch.long))

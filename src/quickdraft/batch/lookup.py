"""Prompt lookup for a growing sequence at a constant cost per token.

``PromptLookupDrafter`` searches the whole sequence each step (a tensor scan per n-gram size),
which is fine for one sequence but adds up over a batch of rows. ``NgramIndex`` keeps, for every
n-gram of the sequence, where the token after its latest occurrence is, updated as tokens are
appended; a proposal is then one dictionary look-up per n-gram size. Its proposals are exactly
``PromptLookupDrafter``'s (the latest earlier match of the longest suffix n-gram, from
``max_ngram`` down to ``min_ngram``), so a seeded row drafts the same copies as the library.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """The n-grams (``min_ngram`` to ``max_ngram`` tokens) of one sequence and what followed them.

    Example (``max_ngram=2``): after ``a b c d a b``, the suffix ``a b`` last occurred earlier at
    position 0, followed by ``c``: ``propose(3)`` returns ``[c, d, a]``.
    """

    def __init__(self, tokens: Sequence[int] = (), max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        # n-gram -> index of the token after its latest occurrence that is not the sequence's end.
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            # The n-grams ending at the current end now have a token after them: this one.
            end = len(self.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._next[tuple(self.tokens[end - n:])] = end
            self.tokens.append(int(token))

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix n-gram."""
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            start = self._next.get(tuple(self.tokens[end - n:]))
            if start is not None:
                return self.tokens[start:start + k]
        return []

"""Turning generated token ids into text incrementally, and finding stop strings in it."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase


class Detokenizer:
    """Accumulates generated ids and hands out text that will not change any more.

    The whole generation is decoded again after each step (cheap next to a forward pass) and
    the part not handed out yet is returned. Two kinds of tail are held back: an incomplete
    UTF-8 character (decoded as U+FFFD until its last byte arrives) and anything that could
    still turn into a stop string, so streamed text never has to be taken back.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.emitted = 0  # characters of text already handed out
        self.stopped = False
        self._text = ""
        self._holdback = max((len(s) for s in self.stop), default=1) - 1

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: Sequence[int]) -> tuple[str, int]:
        """Add tokens; return (new stable text, how many of ``new_ids`` to keep).

        The count is ``len(new_ids)`` unless a stop string was completed: then the tokens
        after the one that completed it are dropped, ``stopped`` is set, and the text ends
        just before the stop string.
        """
        before = len(self.ids)
        self.ids.extend(new_ids)
        self._text = self._decode(self.ids)
        keep = len(new_ids)
        if self.stop:
            search_from = max(0, self.emitted - self._holdback)
            hits = [(i, s) for s in self.stop if (i := self._text.find(s, search_from)) >= 0]
            if hits:
                cut, stop = min(hits)
                keep = self._tokens_to_complete(before, cut + len(stop)) - before
                del self.ids[before + keep :]
                self._text = self._text[:cut]
                self.stopped = True
        return self._take(final=self.stopped), keep

    def _tokens_to_complete(self, start: int, num_chars: int) -> int:
        """Fewest ids (at least ``start + 1``) whose text has ``num_chars`` characters."""
        for m in range(start + 1, len(self.ids) + 1):
            if len(self._decode(self.ids[:m])) >= num_chars:
                return m
        return len(self.ids)

    def flush(self) -> str:
        """All text not handed out yet (call when generation has ended)."""
        return self._take(final=True)

    def _take(self, final: bool) -> str:
        end = len(self._text)
        if not final:
            end -= self._holdback
            while end > self.emitted and self._text[end - 1] == "\ufffd":
                end -= 1
        if end <= self.emitted:
            return ""
        chunk = self._text[self.emitted : end]
        self.emitted = end
        return chunk

    @property
    def text(self) -> str:
        """Everything decoded so far (ending before a stop string, if one was hit)."""
        return self._text

"""One model's forward passes over many sequences at once, each row with its own length.

The batched counterpart of ``quickdraft.runner.ModelRunner``: each row remembers the token ids
its cache holds, so a caller hands over each row's whole sequence (plus drafts) and only what
the cache lacks is fed (``forward_tails``). The engine's commit rolls rejected drafts back
(``truncate``); ``forward_tails`` still feeds whatever a row lacks, so a row never reads stale
positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from quickdraft.batch.cache import BatchKVCache
from quickdraft.models.base import LoadedModel
from quickdraft.runner import common_prefix_length

# The token fed in padded positions; any id works (nothing real attends to it).
PAD_TOKEN = 0
# A row whose prompt shares at least this many more tokens with a row a forward feeds than any
# row holds now waits for that forward and copies them (``waits_for``).
MIN_SHARED_PREFIX = 16

# An output layer for some positions: ``head(hidden, rows)`` -> ``[n, V]`` logits of ``hidden``
# (``[n, H]``), position ``i`` belonging to row ``rows[i]``.
Head = Callable[[torch.Tensor, list[int]], torch.Tensor]


class BatchRunner:
    """Forwards of one model over rows that join and leave.

    Attributes:
        model: the loaded model.
        cache: the rows' keys and values.
        cached_ids: ``cached_ids[b]`` the token ids whose keys/values row ``b`` holds.
        forwards, positions: forward passes run, and positions they computed (``computed``).
        keep_features: whether ``features`` is available: each row's last-layer hidden state of
            every cached position (what an EAGLE or Medusa head drafts from).
    """

    def __init__(self, model: LoadedModel, keep_features: bool = False) -> None:
        self.model = model
        self.keep_features = keep_features
        self.cache = BatchKVCache(model.module.config, model.dtype, model.device)
        self.cached_ids: list[list[int]] = []
        self.forwards = 0
        self.positions = 0
        # Per row [capacity, H]; rows past len(cached_ids[row]) are stale. Grown by doubling so
        # that a step does not copy the sequence.
        self._features: list[torch.Tensor | None] = []

    def add_row(self) -> int:
        self.cached_ids.append([])
        self._features.append(None)
        return self.cache.add_row()

    def remove_row(self, row: int) -> None:
        """Free ``row``; the last row takes its index (see ``BatchKVCache.remove_row``)."""
        last = self.cached_ids.pop()
        last_features = self._features.pop()
        if row < len(self.cached_ids):
            self.cached_ids[row] = last
            self._features[row] = last_features
        self.cache.remove_row(row)

    def features(self, row: int, length: int) -> torch.Tensor:
        """``[length, H]`` the last-layer hidden states (after the final norm) of ``row``'s first
        ``length`` cached tokens; a view, valid until the next forward."""
        assert self.keep_features, "construct the runner with keep_features=True"
        assert 0 <= length <= len(self.cached_ids[row]), (length, len(self.cached_ids[row]))
        stored = self._features[row]
        if stored is None:
            hidden_size = self.model.module.get_output_embeddings().weight.shape[1]
            return torch.empty((0, hidden_size), dtype=self.model.dtype, device=self.model.device)
        return stored[:length]

    def _store_features(self, row: int, start: int, hidden: torch.Tensor) -> None:
        """Write ``hidden`` (``[T, H]``) as row ``row``'s features of positions ``start ..``."""
        end = start + hidden.shape[0]
        stored = self._features[row]
        if stored is None or stored.shape[0] < end:
            grown = hidden.new_empty((max(end, 2 * start, 64), hidden.shape[1]))
            if stored is not None:
                grown[:start] = stored[:start]
            self._features[row] = stored = grown
        stored[start:end] = hidden

    @torch.inference_mode()
    def forward(self, first: int, tokens: Sequence[Sequence[int]], num_logits: Sequence[int],
                head: Head | None = None) -> list[torch.Tensor]:
        """Feed ``tokens[i]`` to row ``first + i`` (rows ``first .. first + len(tokens) - 1``, in one forward).

        Returns, per row, ``[num_logits[i], V]`` logits of its last ``num_logits[i]`` fed tokens
        (``[0, V]`` for a row fed nothing), from the model's output layer or ``head``.
        """
        fed = [len(t) for t in tokens]
        width = max(fed)
        assert width > 0 and all(0 <= n <= f for n, f in zip(num_logits, fed))
        device = self.model.device
        positions, mask = self.cache.begin_forward(first, fed, width)
        ids = torch.full((len(tokens), width), PAD_TOKEN, dtype=torch.long)  # [b, T]
        for i, row_tokens in enumerate(tokens):
            ids[i, : len(row_tokens)] = torch.tensor(list(row_tokens), dtype=torch.long)
        keep = max(num_logits)
        lean = self.model.lean
        try:
            if lean is not None:
                hidden = lean(ids.to(device), self.cache, positions, mask, fed)  # [b, T, H]
            else:
                hidden = self.model.module.get_decoder()(
                    input_ids=ids.to(device), attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True,
                ).last_hidden_state  # [b, T, H]
        finally:
            self.cache.end_forward(fed)
        for i, row_tokens in enumerate(tokens):
            if self.keep_features and fed[i]:
                self._store_features(first + i, len(self.cached_ids[first + i]), hidden[i, : fed[i]])
            self.cached_ids[first + i].extend(int(t) for t in row_tokens)
        self.forwards += 1
        self.positions += self.computed(fed)
        if keep == 0:
            return [hidden.new_empty((0, self.model.vocab_size)) for _ in tokens]
        # Only the rows' last real positions go through the output layer.
        owners = [i for i, n in enumerate(num_logits) for _ in range(n)]  # the row of each kept position
        rows = torch.tensor(owners, dtype=torch.long)
        cols = torch.tensor([f - n + j for n, f in zip(num_logits, fed) for j in range(n)], dtype=torch.long)
        kept = hidden[rows, cols]  # [sum(num_logits), H]
        if head is None:
            logits = self.model.module.get_output_embeddings()(kept)  # [sum(num_logits), V]
        else:
            logits = head(kept, [first + i for i in owners])
        return list(logits.split(list(num_logits)))

    @property
    def ragged(self) -> bool:
        """Whether a forward computes each row's fed positions only (the lean forward: its linear
        layers skip the padding), not ``rows x`` the longest."""
        return self.model.lean is not None

    def computed(self, fed: Sequence[int]) -> int:
        """Positions a forward feeding ``fed[i]`` tokens to each of its rows computes."""
        return sum(fed) if self.ragged else len(fed) * max(fed, default=0)

    def forward_tails(self, first: int, sequences: Sequence[Sequence[int] | None], num_logits: Sequence[int],
                      head: Head | None = None) -> list[torch.Tensor]:
        """Bring rows ``first ..`` up to ``sequences`` (None: leave that row as it is), feeding
        what each cache lacks, and always at least the last ``num_logits[i]`` tokens.

        Returns per row ``[num_logits[i], V]`` logits: the model's prediction after each of
        the sequence's last ``num_logits[i]`` tokens.
        """
        tails = []
        for i, sequence in enumerate(sequences):
            row = first + i
            if sequence is None:
                tails.append([])
                continue
            keep = min(common_prefix_length(self.cached_ids[row], sequence), len(sequence) - num_logits[i])
            self.truncate(row, keep)
            tails.append(list(sequence[keep:]))
        return self.forward(first, tails, num_logits, head)

    def held_elsewhere(self, row: int, sequence: Sequence[int], than: int = 0) -> tuple[int, int | None]:
        """The longest prefix of ``sequence`` a row other than ``row`` holds, where longer than
        ``than`` positions, and that row; else ``(than, None)``."""
        best, donor = than, None
        for other, ids in enumerate(self.cached_ids):
            if other != row and len(ids) > best:
                shared = common_prefix_length(ids, sequence)
                if shared > best:
                    best, donor = shared, other
        return best, donor

    def share_prefix(self, row: int, sequence: Sequence[int]) -> int:
        """Copy into ``row`` the longest prefix of ``sequence`` another row holds, where that is
        longer than what ``row`` holds of it; returns the positions of ``sequence`` it holds now."""
        best, donor = self.held_elsewhere(row, sequence, common_prefix_length(self.cached_ids[row], sequence))
        if donor is not None:
            self.cache.copy_prefix(donor, row, best)
            self.cached_ids[row] = list(self.cached_ids[donor][:best])
            if self.keep_features:
                self._store_features(row, 0, self._features[donor][:best])
        return best

    def truncate(self, row: int, length: int) -> None:
        self.cache.truncate(row, length)
        del self.cached_ids[row][length:]


def forward_some(runner: BatchRunner, tokens: dict[int, list[int]]) -> int:
    """Feed ``tokens[row]`` to those rows without logits, in as few forwards as keep padding
    to at most half of what each computes: a forward runs over the range of rows from its first
    to its last, the rows in between feeding nothing (joining rows are appended, so they are
    mostly together at the end; rows scattered over a wide batch would otherwise make one
    forward compute every row in between, whose attention the lean forward does not skip).
    Returns the positions computed (``BatchRunner.computed``)."""
    rows = sorted(tokens)
    groups = [[rows[0]]]
    for row in rows[1:]:
        group = groups[-1] + [row]
        if padded_positions(tokens, group) > 2 * sum(len(tokens[r]) for r in group):
            groups.append([row])
        else:
            groups[-1] = group
    computed = runner.positions
    for group in groups:
        first, last = group[0], group[-1]
        runner.forward(first, [tokens.get(row, []) for row in range(first, last + 1)], [0] * (last - first + 1))
    return runner.positions - computed


def timed_forwards(model: LoadedModel, counts: Sequence[int], head: Head | None) -> Iterator[tuple[int, float]]:
    """``(rows, seconds)`` of one forward of ``model`` over each count of rows, one token a row,
    after one forward not timed (a fresh process's first is slower)."""
    runner = BatchRunner(model)
    for _ in range(max(counts)):
        runner.add_row()
    runner.forward(0, [[PAD_TOKEN]], [1], head)
    for rows in counts:
        start = time.perf_counter()
        logits = runner.forward(0, [[PAD_TOKEN]] * rows, [1] * rows, head)
        float(logits[-1][0, 0])  # waits for the forward, which a GPU runs asynchronously
        yield rows, time.perf_counter() - start


def waits_for(sequence: Sequence[int], held: int, fed: Iterable[Sequence[int]]) -> bool:
    """Whether a row holding ``held`` tokens of ``sequence`` could copy ``MIN_SHARED_PREFIX``
    tokens more from one of the sequences rows hold once ``fed``."""
    return any(common_prefix_length(other, sequence) >= held + MIN_SHARED_PREFIX for other in fed)


def padded_positions(tokens: dict[int, list[int]], group: list[int]) -> int:
    """Positions one forward over the rows ``group[0] .. group[-1]`` computes."""
    return (group[-1] - group[0] + 1) * max(len(tokens[row]) for row in group)

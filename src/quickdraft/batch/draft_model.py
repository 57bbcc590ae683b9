"""A draft model with the target's tokenizer, drafting for a set of rows at once.

The batch form of ``DraftModelDrafter``'s chains: one forward per drafted position over the rows
that draft, each row drawing from its own ``q`` with its own generator, from the prompt's last
``DEFAULT_DRAFT_CONTEXT_WINDOW`` tokens, over its own ``draft_vocabulary`` where the model's
vocabulary is large. A row's draft cache lives at the row's index, beside the target's.

The cache holds what the draft read of each row's sequence. A row behind by more than
``STEADY_DRAFT_WIDTH`` tokens (a prompt it has not read, a passage the batch decoded plainly)
catches up first, in forwards without logits; what another row's cache holds of it is copied.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from quickdraft.batch.runner import BatchRunner, Head, forward_some, timed_forwards, waits_for
from quickdraft.drafters.base import Draft, RowAsk, RowsDrafted, draw
from quickdraft.drafters.registry import DEFAULT_DRAFT_CONTEXT_WINDOW, draft_vocabulary_size
from quickdraft.drafters.vocabulary import BatchOutputRows
from quickdraft.models.base import LoadedModel
from quickdraft.runner import common_prefix_length

# A draft forward feeding at most this many tokens a row (the last step's bonus token, and the
# last draft token when all were accepted) is a steady one; a row further behind catches up first.
STEADY_DRAFT_WIDTH = 2
# Row counts one draft forward is timed over when the engine starts (``start_up_timings``).
DRAFT_TIMING_ROWS = (1, 2, 4, 8, 16, 32, 64)


class BatchedDraftModel:
    """Drafts chains for the rows of a batch with one draft model (module docstring).

    Args:
        model: the draft model (the target's token ids).
        context_window: the draft reads each prompt's last this many tokens.
    """

    needs_target_features = False

    def __init__(self, model: LoadedModel, context_window: int = DEFAULT_DRAFT_CONTEXT_WINDOW) -> None:
        self.model = model
        self.name = f"draft:{model.name}"
        self.context_window = context_window
        self.context_length: int | None = model.context_length
        self.runner = BatchRunner(model)
        size = draft_vocabulary_size(model)
        self._vocabulary = BatchOutputRows(model, size) if size is not None else None
        # Per row, at its index: where its view of the sequence starts, its prompt's length,
        # its draft vocabulary beyond the shared one, and the tokens of its view other rows'
        # prompts began with when it joined.
        self._starts: list[int] = []
        self._prompt_lengths: list[int] = []
        self._own_rows: list[torch.Tensor | None] = []
        self._shared: list[int] = []

    # -- rows --------------------------------------------------------------------------------

    def add_row(self, prompt_ids: Sequence[int], others: Sequence[Sequence[int]]) -> None:
        """A row for ``prompt_ids`` after the rows whose sequences are ``others``."""
        self._starts.append(max(0, len(prompt_ids) - self.context_window))
        self._prompt_lengths.append(len(prompt_ids))
        self._own_rows.append(None if self._vocabulary is None else self._vocabulary.own_rows(prompt_ids))
        window = self.view(len(self._starts) - 1, prompt_ids)
        self._shared.append(max((common_prefix_length(self.view(i, other), window[:-1])
                                 for i, other in enumerate(others)), default=0))
        self.runner.add_row()

    def remove_row(self, index: int) -> None:
        """Free row ``index``; the last row takes its index (as the target's cache does)."""
        for per_row in (self._starts, self._prompt_lengths, self._own_rows, self._shared):
            last = per_row.pop()
            if index < len(per_row):
                per_row[index] = last
        self.runner.remove_row(index)

    def shrink(self, slots: int) -> None:
        self.runner.cache.shrink(slots)

    def view(self, index: int, sequence: Sequence[int]) -> list[int]:
        """What the draft reads of row ``index``'s sequence."""
        return list(sequence[self._starts[index]:])

    def commit(self, index: int, sequence: Sequence[int]) -> None:
        """Keep in row ``index``'s cache what it read of ``sequence``; roll its drafts back."""
        self.runner.truncate(index, common_prefix_length(self.runner.cached_ids[index], self.view(index, sequence)))

    def cache_bytes(self, positions: int) -> int:
        return self.runner.cache.nbytes

    @property
    def bytes_per_slot(self) -> int:
        return self.runner.cache.bytes_per_slot

    def start_up_timings(self) -> dict[int, float]:
        """Seconds of one forward over each of ``DRAFT_TIMING_ROWS`` rows, one token a row."""
        vocabulary = self._vocabulary
        no_rows = torch.empty(0, dtype=torch.long)
        head = None if vocabulary is None else (lambda hidden, rows: vocabulary.logits(hidden, [no_rows] * len(rows)))
        return dict(timed_forwards(self.model, DRAFT_TIMING_ROWS, head))

    # -- what drafting would read -------------------------------------------------------------

    def prompt_to_read(self, index: int) -> int:
        """Prompt positions row ``index``'s draft reads that no other row's prompt began with."""
        return self._prompt_lengths[index] - self._starts[index] - self._shared[index]

    def behind(self, index: int, view: Sequence[int], reading: dict[int, Sequence[int]] | None = None) -> int:
        """Tokens a catch-up would feed row ``index`` whose view is ``view``; with ``reading``
        (the views of the rows that may draft, by index, this row's among them), the policy's
        estimate, where the part of the prompt the row shared with others when it joined is
        copied: from a row whose draft holds it now, at no cost; where none does, read once by
        the first of the rows sharing it and copied by the rest, so each of them is charged its
        share. (Counted as copied whatever held it, rows whose twins had left would be priced a
        few tokens behind and then read whole prompts in one step.)

        A row that has still to copy a prefix is at least 1 behind, never level: counted level,
        rows sharing prompts would all be let draft in one probe that reads every prompt."""
        held = common_prefix_length(self.runner.cached_ids[index], view)
        shared = self._shared[index]
        if reading is None or held >= shared:
            lag = len(view) - held
            return lag - 1 if lag > STEADY_DRAFT_WIDTH else 0
        copyable = self.runner.held_elsewhere(index, view, held)[0]
        unheld = max(0, shared - max(held, copyable))
        prefix = list(view[:shared])
        sharers = max(1, sum(1 for other in reading.values() if list(other[:shared]) == prefix))
        lag = len(view) - shared + -(-unheld // sharers)
        return lag - 1 if lag > STEADY_DRAFT_WIDTH else 1

    # -- drafting ----------------------------------------------------------------------------

    def propose_rows(self, asks: Sequence[RowAsk]) -> RowsDrafted:
        """Each ask's chain of ``ask.k`` tokens (``ask.row``: the row's index), after the
        catch-ups of the rows behind.

        One batched forward per position over the rows from the first asking row to the last
        (the rows in between feed nothing: a forward over every row would make a probe's one
        drafting row pay for all the others' padding). ``forwards`` and ``seconds`` are the
        forwards after the catch-ups and their time, draws included: what a draft forward costs
        the policy, which prices catch-ups apart."""
        by_row = {ask.row: ask for ask in asks}
        counts = {ask.row: [0, 0] for ask in asks}
        if not by_row:
            return RowsDrafted([], 0, 0.0, [])
        views: list[list[int] | None] = [self.view(i, by_row[i].sequence) if i in by_row else None
                                         for i in range(len(self._starts))]
        catch_ups = self._catch_up(views, counts)
        head = self._head()
        start = time.perf_counter()
        span = range(min(by_row), max(by_row) + 1)
        first = span.start
        logits = self.runner.forward_tails(first, views[first:span.stop], [int(i in by_row) for i in span], head)
        tokens: dict[int, list[int]] = {i: [] for i in by_row}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in by_row}
        forwards = 1
        for position in range(max(ask.k for ask in asks)):
            for i, ask in by_row.items():
                if position < ask.k:
                    token, q = draw(logits[i - first][-1], tokens[i], ask.params, ask.generator, ask.processor)
                    tokens[i].append(token)
                    if q is not None:
                        probs[i].append(q)
            more = [[tokens[i][-1]] if i in by_row and position + 1 < by_row[i].k else [] for i in span]
            if any(more):
                logits = self.runner.forward(first, more, [len(t) for t in more], head)
                forwards += 1
        drafts = []
        for ask in asks:
            i = ask.row
            counts[i][0] += forwards
            counts[i][1] += ask.k
            drafts.append(Draft(tokens=torch.tensor(tokens[i], dtype=torch.long),
                                probs=torch.stack(probs[i]) if probs[i] else None))
        return RowsDrafted(drafts, forwards, time.perf_counter() - start,
                           [tuple(counts[ask.row]) for ask in asks], catch_ups)

    def _catch_up(self, views: list[list[int] | None], counts: dict[int, list[int]]) -> list[tuple[int, float]]:
        """Feed the draft, in forwards without logits (``forward_some``), what rows about to
        draft lack beyond their last ``STEADY_DRAFT_WIDTH`` tokens: paid once per row, and only
        by rows that draft. What another row holds is copied (``BatchRunner.share_prefix``);
        rows that a row catching up would give ``MIN_SHARED_PREFIX`` tokens more copy them after
        it, in a second forward. Returns each forward's positions and seconds."""
        behind: dict[int, list[int]] = {}  # row -> its view, but the last token
        for i, view in enumerate(views):
            if view is not None and self.behind(i, view):
                behind[i] = view[:-1]  # the last token is fed with the first draft forward
        held: dict[int, int] = {}  # row -> positions of its view its cache holds
        leaders: dict[int, list[int]] = {}
        for i, view in behind.items():
            held[i] = self.runner.share_prefix(i, view)
            if not waits_for(view, held[i], leaders.values()):
                leaders[i] = view
        timings = self._feed(leaders, held, counts)
        followers = {i: behind[i] for i in behind.keys() - leaders.keys()}
        timings += self._feed(followers, {i: self.runner.share_prefix(i, view) for i, view in followers.items()},
                              counts)
        return timings

    def _feed(self, views: dict[int, list[int]], held: dict[int, int],
              counts: dict[int, list[int]]) -> list[tuple[int, float]]:
        """Feed each row ``i`` of ``views`` from ``held[i]`` on, its cache cut back to that first."""
        tails = {}
        for i in sorted(views):
            self.runner.truncate(i, held[i])
            if held[i] < len(views[i]):
                tails[i] = views[i][held[i]:]
                counts[i][0] += 1
                counts[i][1] += len(tails[i])
        if not tails:
            return []
        start = time.perf_counter()
        positions = forward_some(self.runner, tails)
        return [(positions, time.perf_counter() - start)]

    def _head(self) -> Head | None:
        """The output layer over each row's draft vocabulary (None: all tokens)."""
        vocabulary = self._vocabulary
        if vocabulary is None:
            return None
        return lambda hidden, rows: vocabulary.logits(hidden, [self._own_rows[r] for r in rows])

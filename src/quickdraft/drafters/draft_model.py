"""Drafting with a smaller model that shares the target's tokenizer: chains and trees."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, DrafterBase, Footprint, draw
from quickdraft.drafters.dynamic_tree import draft_scores, grow_dynamic_tree
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.memory import kv_bytes_per_token, weight_bytes
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.runner import ModelRunner, common_prefix_length
from quickdraft.sampling import logits_to_probs
from quickdraft.tree import TreeSpec


# Positions a step's first draft forward reads along with its own token for about the cost of
# one: a drafter further behind the sequence than this (a new prompt, a run of steps that did
# not draft) says so (``behind``) and reads them in a forward of its own (``catch_up``), which
# the policy times and weighs against what drafting would gain.
READ_WITH_STEP = 8


def reset_draft_runner(
    runner: ModelRunner, vocabulary_size: int | None, context_window: int | None, prompt_ids: Sequence[int]
) -> int:
    """Reset a draft model's runner for a new prompt; returns where its view of the sequence
    starts (0, or the first of the prompt's last ``context_window`` tokens).

    Drafting from a window of the prompt is still exact: the target verifies against whatever
    distribution the draft drew from. It bounds the draft's reading of a long prompt (up to a
    third of the target's prefill); prompt lookup still sees the whole prompt.
    """
    runner.reset()
    runner.restrict_vocabulary(draft_vocabulary(runner.model, vocabulary_size, prompt_ids))
    return max(0, len(prompt_ids) - context_window) if context_window is not None else 0


class DraftModelDrafter(DrafterBase):
    """Runs the draft model autoregressively: a chain of k tokens, or a tree level by level.

    A chain costs one forward per token. The cache holds the sequence up to (not including)
    the last token; after a step whose k drafts were all accepted it lacks the last draft token
    as well, and ``propose`` feeds both in one forward, so the draft never skips a position.

    The prompt is read when the draft first drafts, not in ``begin``: where drafting does not pay
    (the policy decodes plainly) its prefill is never paid. A drafter more than
    ``READ_WITH_STEP`` positions behind reports it (``behind``) and reads them in ``catch_up``.

    A tree (``tree``) feeds all nodes of a depth in one forward. Static widths: each node of
    depth ``d`` gets the ``widths[d]`` most probable tokens as children (deterministic, one-hot
    ``q`` for verification), or with ``sample_children`` (and temperature > 0) ``widths[d]``
    tokens drawn i.i.d. from its ``q``. Dynamic budget: see ``TreeSpec``; children are ranked by
    the draft's probability of their whole path. The last level is never fed to the draft
    (nothing is drafted below it), so a tree of depth D costs D draft forwards, as a chain of D
    tokens does. The draft's cache keeps the previous tree's nodes until the next ``propose``,
    which keeps the ones the sequence went through (``ModelRunner.keep_tree_along``): an
    accepted path is not recomputed.

    Args:
        model: the draft model (same vocabulary as the target).
        vocabulary_size: if set, the draft proposes only the ``vocabulary_size`` most frequent
            tokens, the prompt's own tokens and the special tokens
            (``quickdraft.drafters.vocabulary``), and computes only those rows of its output
            layer.
        context_window: if set, the draft sees only the prompt's last ``context_window``
            tokens (and everything generated after them); see ``reset_draft_runner``.
        tree: draft trees of this shape instead of chains.
    """

    def __init__(self, model: LoadedModel, vocabulary_size: int | None = None,
                 context_window: int | None = None, tree: TreeSpec | None = None) -> None:
        self.model = model
        self.spec = tree
        self.name = f"draft:{model.name}" if tree is None else f"draft-tree:{model.name}"
        self.vocabulary_size = vocabulary_size
        self.context_window = context_window
        self._runner = ModelRunner(model)
        self._start = 0  # the sequence's first position the draft sees
        # Counted once: an int8 draft's weights are counted by unpacking each layer (about a
        # second), and the server and the batched engine ask again.
        self._footprint = Footprint(weight_bytes(model), kv_bytes_per_token(model), model.context_length,
                                    f"{model.precision}, {model.device}")

    @property
    def forwards(self) -> int:
        return self._runner.forwards

    @property
    def positions(self) -> int:
        return self._runner.positions

    def footprint(self) -> Footprint:
        return self._footprint

    def fork(self) -> DraftModelDrafter:
        """The same model and settings with a cache of its own (``begin`` sets the rest)."""
        twin = copy.copy(self)
        twin._runner = ModelRunner(self.model)
        return twin

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._start = reset_draft_runner(self._runner, self.vocabulary_size, self.context_window, prompt_ids)

    def behind(self, sequence: Sequence[int]) -> int:
        """Positions of ``sequence`` (but its last token) the draft has not read, when more than
        ``READ_WITH_STEP`` (else 0: ``propose`` reads them with its first forward). Keeps the
        last tree's accepted path first, as ``propose`` would."""
        view = sequence[self._start:-1]
        if self.spec is not None:
            self._runner.keep_tree_along(sequence[self._start:])
        missing = len(view) - common_prefix_length(self._runner.cached_ids, view)
        return missing if missing > READ_WITH_STEP else 0

    def catch_up(self, sequence: Sequence[int]) -> None:
        """Read what ``behind`` counts, in one forward, so that ``propose`` runs the draft's own steps."""
        if self.behind(sequence):
            self._runner.forward_tail(sequence[self._start:-1])

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        if self.spec is None:
            return self._chain(sequence[self._start:], k, params, generator, processor)
        depth = min(self.spec.max_depth, k)
        sequence = sequence[self._start:]
        self._runner.keep_tree_along(sequence)
        root_logits = self._runner.forward_tail(sequence)  # [1, V]
        if self.spec.widths is not None:
            return self._static(sequence, root_logits, self.spec.widths[:depth], params, generator, processor)
        return self._dynamic(sequence, root_logits, depth, params, processor)

    def _chain(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        logits = self._runner.forward_tail(sequence)[-1]  # [V]
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

    def _static(
        self,
        sequence: Sequence[int],
        logits: torch.Tensor,
        widths: Sequence[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        sampled = self.spec.sample_children and not params.greedy
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[torch.Tensor] = []
        level = [-1]  # the nodes whose children this depth drafts; logits[i] is level[i]'s row
        for d, width in enumerate(widths):
            if d > 0:
                logits = self._runner.forward_tree(sequence, tokens, parents, num_logits=len(level))
            logits = processor(logits, tokens, parents, rows=level)  # [n, V], each after its node's path
            if sampled:
                q = logits_to_probs(logits, params)  # [n, V]
                children = torch.multinomial(q, width, replacement=True, generator=generator)  # [n, w]
                probs.extend(q[i] for i in range(len(level)) for _ in range(width))
                keep = torch.ones_like(children, dtype=torch.bool)
            else:
                top = torch.topk(draft_scores(logits, params), width, dim=-1)  # [n, w]
                children = top.indices
                keep = top.values > float("-inf")  # not tokens the draft's top-k/top-p removed
            start = len(tokens)
            # Host sync: the next forward needs the ids.
            for parent, row, row_keep in zip(level, children.tolist(), keep.tolist()):
                for token, kept in zip(row, row_keep):
                    if kept:
                        tokens.append(token)
                        parents.append(parent)
            level = list(range(start, len(tokens)))
        return self._draft(tokens, parents, torch.stack(probs) if sampled else None)

    def _dynamic(
        self, sequence: Sequence[int], logits: torch.Tensor, depth: int, params: SamplingParams,
        processor: LogitsProcessor,
    ) -> Draft:
        """EAGLE-2's dynamic tree (``dynamic_tree.grow_dynamic_tree``), one draft forward per depth."""
        def expand(fed_tokens: list[int], fed_parents: list[int], n: int) -> torch.Tensor:
            return self._runner.forward_tree(sequence, fed_tokens, fed_parents, num_logits=n)

        tokens, parents = grow_dynamic_tree(logits, depth, self.spec.branch, self.spec.budget, params, expand,
                                            processor)
        return self._draft(tokens, parents, None)

    def _draft(self, tokens: list[int], parents: list[int], probs: torch.Tensor | None) -> Draft:
        device = self.model.device
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            probs=probs,
            parents=torch.tensor(parents, dtype=torch.long, device=device),
        )

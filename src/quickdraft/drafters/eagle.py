"""Drafting with a trained EAGLE head (``quickdraft.drafters.eagle_head``) from the target's features:
chains and EAGLE-2 dynamic trees."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, draw
from quickdraft.drafters.dynamic_tree import grow_dynamic_tree
from quickdraft.drafters.eagle_head import EagleHead, load_eagle_head
from quickdraft.drafters.trained_head import TrainedHeadDrafter
from quickdraft.errors import InvalidParameterError
from quickdraft.memory import config_kv_bytes_per_token
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.runner import common_prefix_length
from quickdraft.tree import TreeSpec, additive_mask, forward_layout


class EagleDrafter(TrainedHeadDrafter):
    """Runs the head autoregressively for k tokens: one head forward per token, no target forward.

    The head keeps its own KV cache. Position ``i`` of the cache holds token ``x_{i+1}`` with
    the target's feature ``f_i`` (see ``eagle_head``) for every position the target has seen,
    then the drafted positions, which were fed the head's own predicted features. Each
    ``propose`` keeps the first kind, rolls back the second, and feeds the target's features of
    the tokens accepted since (plus the recovered or bonus token) in one forward.

    With ``tree`` (``TreeSpec(budget=N, depth=D)``) it drafts EAGLE-2's dynamic tree: one head
    forward per depth feeds that depth's expanded nodes, each with its parent's predicted
    feature (the root's children: the prediction after the sequence), attending to the
    sequence's positions and its own ancestors (``quickdraft.tree``). The nodes stay in the
    head's cache after the sequence until the next ``propose`` rolls them back, as it does a
    chain's drafted positions.

    Args:
        head: the trained head, on the target's device and in its dtype (``load_eagle_head``).
        target: the target it was trained for: its embedding and output layer are used.
        tree: draft dynamic trees of this shape instead of chains.
    """

    def __init__(self, head: EagleHead, target: LoadedModel, tree: TreeSpec | None = None) -> None:
        if tree is not None and tree.budget is None:
            raise InvalidParameterError(
                "an EAGLE head drafts dynamic trees: give TreeSpec(budget=N, depth=D) (--tree-budget N)"
            )
        super().__init__(head, target, "eagle" if tree is None else "eagle-tree",
                         "an EAGLE head; it reuses the target's embedding and output layer",
                         config_kv_bytes_per_token(head.config, target.dtype.itemsize))
        self.spec = tree
        self._embed = target.module.get_input_embeddings()
        self._reset_cache()

    def _reset_cache(self) -> None:
        self._cache = DynamicCache(config=self.head.config)
        self._ids: list[int] = []  # token fed at each head position (x_{i+1} at position i)
        self._exact = 0  # leading positions fed with the target's features (the rest: drafted)

    def fork(self) -> EagleDrafter:
        """The same head with a KV cache of its own."""
        twin = super().fork()
        twin._reset_cache()
        return twin

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Forget the last sequence and choose the vocabulary; the prompt is fed at the first
        ``propose``, when the target's features of it are known."""
        self._reset_cache()
        super().begin(prompt_ids)

    @torch.inference_mode()
    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor,
    ) -> Draft:
        if self.spec is not None:
            return self._tree(sequence, min(self.spec.max_depth, k), params, processor)
        hidden = self._sync(sequence)  # [1, H]
        device = self._output.weight.device
        if hidden is None:
            return Draft(tokens=torch.empty(0, dtype=torch.long, device=device))
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            token, q = draw(self._logits(hidden)[0], tokens, params, generator, processor)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if i < k - 1:
                hidden = self._forward(tokens[-1:], hidden)  # [1, H]
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            probs=torch.stack(probs) if probs else None,
        )

    def _sync(self, sequence: Sequence[int]) -> torch.Tensor | None:
        """Bring the head up to ``sequence``; ``[1, H]`` its predicted feature after the last
        token (whose logits draft the first token), or ``None`` before the target saw a token."""
        length = len(sequence)
        features = self._features
        assert features is not None and features.shape[0] == length - 1, "observe_target first"
        if length < 2:
            return None
        # Keep the positions fed with the target's features that still match the sequence;
        # feed at least one, whose output drafts the first token.
        keep = min(self._exact, common_prefix_length(self._ids, sequence[1:]), length - 2)
        self._truncate(keep)
        hidden = self._forward(sequence[keep + 1 :], features[keep:])[-1:]  # [1, H]
        self._exact = length - 1
        return hidden

    def _truncate(self, length: int) -> None:
        self._cache.crop(length - len(self._ids))  # transformers: a negative count removes that many
        del self._ids[length:]

    def _forward(
        self,
        tokens: Sequence[int],
        features: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` (``[T]``) with ``features`` (``[T, H]``) after the cached positions;
        returns the ``[T, H]`` predicted features.

        A chain continues the cached positions (causal attention); tree nodes give their
        ``[T]`` positions and ``[T, cached + T]`` bool mask (``quickdraft.tree.forward_layout``).
        """
        start = len(self._ids)
        device = self._output.weight.device
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)  # [1, T]
        if positions is None:
            positions = torch.arange(start, start + ids.shape[1])  # [T]
        embeddings = self._embed(ids)  # [1, T, H]
        attention = None if mask is None else additive_mask(mask, embeddings.dtype).to(device)
        out = self.head(embeddings, features[None].to(embeddings.dtype), self._cache,
                        positions[None].to(device), attention)[0]
        self._ids.extend(int(t) for t in tokens)
        self.forwards += 1
        self.positions += len(tokens)
        return out  # [T, H]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` logits of predicted features (``[n, H]``); -inf outside the vocabulary drafted over."""
        return self._output.logits(hidden)

    def _tree(self, sequence: Sequence[int], depth: int, params: SamplingParams, processor: LogitsProcessor) -> Draft:
        root = self._sync(sequence)  # [1, H]
        device = self._output.weight.device
        if root is None:
            return Draft(tokens=torch.empty(0, dtype=torch.long, device=device),
                         parents=torch.empty(0, dtype=torch.long, device=device))
        cached = len(self._ids)  # the sequence's positions: the tree hangs below the last
        predicted: list[torch.Tensor] = []  # [H] predicted feature of each fed node, in order

        def expand(fed_tokens: list[int], fed_parents: list[int], n: int) -> torch.Tensor:
            first = len(fed_tokens) - n
            mask, positions = forward_layout(cached, 0, fed_parents, first_node=first)
            inputs = torch.stack([root[0] if p < 0 else predicted[p] for p in fed_parents[first:]])  # [n, H]
            out = self._forward(fed_tokens[first:], inputs, positions, mask)  # [n, H]
            predicted.extend(out)
            return self._logits(out)  # [n, V]

        tokens, parents = grow_dynamic_tree(self._logits(root), depth, self.spec.branch, self.spec.budget,
                                            params, expand, processor)
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long, device=device),
                     parents=torch.tensor(parents, dtype=torch.long, device=device))


def build(argument: str, target: LoadedModel, tree: TreeSpec | None) -> EagleDrafter:
    """``draft="eagle:DIR"`` (the registry's entry): the head trained for ``target`` in DIR."""
    return EagleDrafter(load_eagle_head(argument, target), target, tree)

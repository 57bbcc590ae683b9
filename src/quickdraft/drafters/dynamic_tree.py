"""EAGLE-2's dynamic draft tree, grown by any drafter that can score a level of nodes in one forward."""

from __future__ import annotations

from collections.abc import Callable

import torch

from quickdraft.config import SamplingParams
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import logits_to_probs

# expand(fed_tokens, fed_parents, n): feed the last n of the expanded nodes (``fed_parents``
# index the expanded nodes, -1 is the root) and return their ``[n, V]`` logits.
Expand = Callable[[list[int], list[int], int], torch.Tensor]


def draft_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[n, V]`` float32 log-probabilities children are ranked by (``q`` when sampling)."""
    if params.greedy:
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(logits_to_probs(logits, params))


def grow_dynamic_tree(
    root_logits: torch.Tensor, depth: int, branch: int, budget: int, params: SamplingParams, expand: Expand,
    processor: LogitsProcessor,
) -> tuple[list[int], list[int]]:
    """EAGLE-2: expand the ``branch`` best paths per depth, keep the ``budget`` best nodes.

    Every proposed child joins a pool with its path's log-probability; only the ``branch``
    best of each depth are expanded (``expand``). A child's score is at most its parent's, so
    the ``budget`` best of the pool (ties to the shallower) include their ancestors and form a
    tree.

    Args:
        root_logits: ``[1, V]`` the drafter's logits after the sequence (the root's children).
        processor: the prefix-dependent options, applied to every expanded node's row along
            its path through the fed nodes.

    Returns:
        The tree's tokens and parents (``quickdraft.tree``), at most ``depth`` deep.
    """
    pool_tokens: list[int] = []
    pool_parents: list[int] = []
    pool_scores: list[float] = []
    pool_depths: list[int] = []
    fed_tokens: list[int] = []  # the expanded nodes, in the order they were fed
    fed_parents: list[int] = []
    fed_index: dict[int, int] = {-1: -1}  # pool node -> its index among the fed nodes
    frontier = [-1]
    frontier_scores = torch.zeros(1)
    logits = processor(root_logits)
    for d in range(depth):
        if d > 0:
            for node in frontier:
                fed_index[node] = len(fed_tokens)
                fed_tokens.append(pool_tokens[node])
                fed_parents.append(fed_index[pool_parents[node]])
            logits = expand(fed_tokens, fed_parents, len(frontier))
            first = len(fed_tokens) - len(frontier)
            logits = processor(logits, fed_tokens, fed_parents, rows=range(first, len(fed_tokens)))
        top = torch.topk(draft_scores(logits, params), min(branch, logits.shape[-1]), dim=-1)
        scores = frontier_scores[:, None] + top.values.cpu()  # [F, b] log-probability of each path
        start = len(pool_tokens)
        # Host sync: the pool is bookkeeping on the host.
        for parent, row, row_scores in zip(frontier, top.indices.tolist(), scores.tolist()):
            for token, score in zip(row, row_scores):
                if score > float("-inf"):
                    pool_tokens.append(token)
                    pool_parents.append(parent)
                    pool_scores.append(score)
                    pool_depths.append(d + 1)
        new = torch.tensor(pool_scores[start:])
        if new.numel() == 0:
            break
        best = torch.topk(new, min(branch, new.numel())).indices.tolist()
        frontier = [start + i for i in best]
        frontier_scores = new[best]
    ranked = sorted(range(len(pool_tokens)), key=lambda i: (-pool_scores[i], pool_depths[i], i))
    tokens: list[int] = []
    parents: list[int] = []
    index = {-1: -1}  # pool node -> tree node
    for node in sorted(ranked[:budget]):  # pool order: parents before children
        # Always true but for rounding (a log-probability a hair above 0).
        if pool_parents[node] in index:
            index[node] = len(tokens)
            tokens.append(pool_tokens[node])
            parents.append(index[pool_parents[node]])
    return tokens, parents

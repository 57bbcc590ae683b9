"""Acceptance rules for a tree of drafts: pure functions of tensors and a Generator.

The vocabulary is ``verify.py``'s: ``q`` is the **draft's** distribution (the one a node's token
was drawn from), ``p`` the **target's**, both after the same temperature / top-k / top-p.

A tree (``quickdraft.tree``) has ``N`` nodes: ``tokens[i]``, ``parents[i]`` (-1: a child of the
root, the sequence's last token). The target scores ``N + 1`` positions in one forward: row 0 is
``p`` after the root, row ``i + 1`` is ``p`` after node ``i`` (its root-to-node path appended).
Verification walks down from the root; at each node it tries the node's children in order:

* **accepted path**: the nodes kept, root to deepest (at most one per depth);
* **recovered**: the token drawn where no child of the current node was accepted;
* **bonus**: the token drawn from ``p`` after an accepted leaf.

Every step emits ``len(path) + 1`` tokens, as a chain does.

Greedy: at each node, accept the first child whose token is the target's argmax; if none is,
the argmax is the recovered token. The output is plain greedy decoding's, token for token.

Sampling, recursive rejection over siblings (SpecInfer, Miao et al. 2024, arXiv:2305.09781;
Sequoia, Chen et al. 2024, arXiv:2402.12374, for deterministic siblings). Start from ``p`` at
the current node; for each child ``x`` in turn, drawn from ``q`` (its row of ``draft_probs``):

* accept ``x`` with probability ``min(1, p(x) / q(x))``: descend to it, ``p`` := its target row;
* else ``p := norm(max(0, p - q))`` and try the next sibling.

If every child is rejected, the recovered token is drawn from the last ``p``. A deterministic
child (top-b tokens, n-gram branches; ``draft_probs is None``) is a one-hot ``q``: accept with
probability ``p(x)``, and on rejection ``p(x) := 0``, renormalised.

Why the output is exactly the target's: each sibling is one ordinary speculative-sampling step
(Leviathan et al. 2023) whose target is the current ``p``; it emits a sample of ``p`` made of
"accept ``x``" or "a sample of the residual", and the residual sample is produced by the next
sibling's step (its token was drawn independently of these verification draws), down to the
final draw. Siblings that repeat a token need no special case: after ``x`` is rejected the
residual has ``p(x) = 0`` (a rejection needs ``p(x) < q(x)``, or ``q`` one-hot), so a later
copy of ``x`` is rejected for sure, as it must be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.sampling import greedy, sample
from quickdraft.tree import children_of
from quickdraft.verify import check_draft_tokens, residual


@dataclass(frozen=True)
class TreeStepResult:
    """Outcome of verifying one draft tree.

    Attributes:
        path: the accepted nodes, root to deepest (empty: the root's children were all rejected).
        next_token: the recovered token (after a rejection) or the bonus token (after a leaf).
    """

    path: tuple[int, ...]
    next_token: int

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def _check_tree(tokens: torch.Tensor, parents: torch.Tensor, target_rows: torch.Tensor) -> None:
    assert tokens.dim() == 1 and parents.shape == tokens.shape, (tokens.shape, parents.shape)
    assert target_rows.dim() == 2 and target_rows.shape[0] == tokens.shape[0] + 1, target_rows.shape
    check_draft_tokens(tokens, target_rows.shape[1])


def verify_tree_greedy(
    tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor
) -> TreeStepResult:
    """Greedy acceptance: follow the target's argmax down the tree.

    Args:
        tokens: ``[N]`` int64 node tokens (N may be 0).
        parents: ``[N]`` int64 parent of each node (-1: the root).
        target_logits: ``[N + 1, V]`` target logits after the root and after each node.
    """
    _check_tree(tokens, parents, target_logits)
    # Host syncs: the walk branches on token ids; one transfer each, the tree is small.
    choice = greedy(target_logits).tolist()  # [N + 1]
    token_list = tokens.tolist()
    children = children_of(parents.tolist())
    path: list[int] = []
    node = -1
    while True:
        wanted = choice[node + 1]
        node = next((c for c in children[node] if token_list[c] == wanted), None)
        if node is None:
            return TreeStepResult(tuple(path), wanted)
        path.append(node)


def verify_tree_sampled(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> TreeStepResult:
    """Multi-candidate speculative sampling down a tree (see the module docstring).

    Args:
        tokens: ``[N]`` int64 node tokens (N may be 0: then this samples from ``p``).
        parents: ``[N]`` int64 parent of each node (-1: the root).
        draft_probs: ``[N, V]`` float32 ``q`` each node was drawn from (siblings drawn i.i.d.
            share their parent's row), or ``None`` for deterministic nodes (one-hot ``q``).
        target_probs: ``[N + 1, V]`` float32 ``p`` after the root and after each node.
        generator: random source for the uniform draws and the recovered/bonus sample.
    """
    _check_tree(tokens, parents, target_probs)
    if draft_probs is not None:
        assert draft_probs.shape == (tokens.shape[0], target_probs.shape[1]), draft_probs.shape
    token_list = tokens.tolist()
    children = children_of(parents.tolist())
    path: list[int] = []
    node = -1
    p = target_probs[0]  # [V]
    while True:
        for child in children[node]:
            x = token_list[child]
            q = None if draft_probs is None else draft_probs[child]  # [V]
            q_x = 1.0 if q is None else q[x]
            u = torch.rand((), generator=generator, device=target_probs.device)
            # Accept iff u < p/q, without the division (q = 0 accepts exactly when p > 0).
            # Host sync: the walk goes one way or the other.
            if bool(u * q_x < p[x]):
                path.append(child)
                node = child
                p = target_probs[child + 1]
                break
            p = residual(p, q, x)
        else:
            # No child accepted (or a leaf reached): recovered or bonus token from p.
            return TreeStepResult(tuple(path), int(sample(p, generator).item()))

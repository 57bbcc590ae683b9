"""Draft trees: their shape (``TreeSpec``), their structure, and the mask and positions of a forward.

A tree of drafts hangs below the **root**, the last token of the sequence decoded so far. Its
``N`` nodes are numbered so that a parent always comes before its children, and the whole
structure is one list: ``parents[i]`` is the node that node ``i`` continues, or ``-1`` when it
continues the root. A chain of K drafts is the tree ``parents = [-1, 0, 1, ..., K - 2]``.
The **depth** of a node is 1 for the root's children, 2 for theirs, and so on.

Worked example: the sequence ``a b c d`` with the root ``d``, and three drafted nodes::

    d ─┬─ x (node 0)  ── z (node 2)        parents = [-1, -1, 0]
       └─ y (node 1)                       depths  = [ 1,  1, 2]

One forward verifies every branch at once. Each node attends to the sequence and to its own
ancestors (and itself), never to a sibling or a cousin, and its position is the root's plus its
depth, so node ``i`` sees exactly what it would see if its root-to-node path were the only
continuation. With ``a b c`` already in the KV cache, the forward feeds ``d x y z``::

               a b c  d | x y z     position
          d    1 1 1  1 | 0 0 0     3
          x    1 1 1  1 | 1 0 0     4
          y    1 1 1  1 | 0 1 0     4
          z    1 1 1  1 | 1 0 1     5

(``forward_layout(cached=3, tail=1, parents=[-1, -1, 0])`` returns this mask and these positions.)
The models take the mask as a 4-D ``attention_mask`` and the positions as ``position_ids``, their
public forward arguments: transformers hands a 4-D mask to the attention unchanged
(``masking_utils._preprocess_mask_arguments``), so no model file is forked or patched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.errors import InvalidParameterError

DEFAULT_DYNAMIC_DEPTH = 6
DEFAULT_BRANCH = 4


@dataclass(frozen=True)
class TreeSpec:
    """The shape of the draft tree built each step: static widths, or a dynamic node budget.

    Give exactly one of ``widths`` and ``budget``:

    * ``TreeSpec(widths=(3, 2, 2, 1))``: a static tree. The root gets 3 children, every node of
      depth 1 gets 2, every node of depth 2 gets 2, every node of depth 3 gets 1: 3 + 6 + 12 + 12
      = 33 nodes, depth 4. A draft model proposes its ``w`` most probable tokens as a node's
      children (or, with ``sample_children``, ``w`` tokens drawn independently from its ``q``).
    * ``TreeSpec(budget=16, depth=6)``: a dynamic tree (EAGLE-2, Li et al. 2024,
      arXiv:2406.16858). At each depth the ``branch`` nodes with the highest draft probability
      of their whole path are expanded with their ``branch`` most probable children; the tree
      is then the ``budget`` most probable paths' nodes among everything proposed.

    Attributes:
        widths: children per node at each depth (static tree).
        budget: number of nodes of a dynamic tree.
        depth: depth of a dynamic tree (default 6); static trees are ``len(widths)`` deep.
        branch: a dynamic tree's children per expanded node and nodes expanded per depth; also
            the number of n-gram matches a prompt-lookup tree may use (static: ``widths[0]``).
        sample_children: static trees only, when sampling: draw each node's children i.i.d.
            from the draft's ``q`` instead of taking its top tokens. Better when draft and target
            agree closely (one child accepts with ``1 - TV(p, q)`` instead of ``p(top token)``);
            drawn tokens may repeat, which costs verification positions but not correctness.

    The decoder's K caps the depth each step (the loop never drafts past ``max_new_tokens``).
    """

    widths: tuple[int, ...] | None = None
    budget: int | None = None
    depth: int | None = None
    branch: int = DEFAULT_BRANCH
    sample_children: bool = False

    def __post_init__(self) -> None:
        if (self.widths is None) == (self.budget is None):
            raise InvalidParameterError(
                "a tree needs exactly one of widths (static, e.g. (3, 2, 2, 1)) and budget "
                "(dynamic, e.g. budget=16, depth=6)"
            )
        if self.widths is not None:
            object.__setattr__(self, "widths", tuple(self.widths))
            if not self.widths or any(not isinstance(w, int) or w < 1 for w in self.widths):
                raise InvalidParameterError(f"tree widths must be integers >= 1, got {self.widths}")
            if self.depth is not None and self.depth != len(self.widths):
                raise InvalidParameterError(
                    f"a static tree is len(widths) = {len(self.widths)} deep; drop depth={self.depth}"
                )
        else:
            if not isinstance(self.budget, int) or self.budget < 1:
                raise InvalidParameterError(f"tree budget must be an integer >= 1, got {self.budget}")
            if self.sample_children:
                raise InvalidParameterError(
                    "sample_children needs static widths: a dynamic tree ranks tokens by draft probability"
                )
        if self.depth is not None and (not isinstance(self.depth, int) or self.depth < 1):
            raise InvalidParameterError(f"tree depth must be an integer >= 1, got {self.depth}")
        if not isinstance(self.branch, int) or self.branch < 1:
            raise InvalidParameterError(f"tree branch must be an integer >= 1, got {self.branch}")

    @property
    def max_depth(self) -> int:
        if self.widths is not None:
            return len(self.widths)
        return self.depth if self.depth is not None else DEFAULT_DYNAMIC_DEPTH

    @property
    def max_nodes(self) -> int:
        if self.budget is not None:
            return self.budget
        nodes, level = 0, 1
        for width in self.widths:
            level *= width
            nodes += level
        return nodes

    @property
    def root_branches(self) -> int:
        """How many distinct continuations may leave the root."""
        return self.widths[0] if self.widths is not None else self.branch


def static_parents(widths: Sequence[int]) -> list[int]:
    """Parents of the full tree with ``widths[d]`` children per node of depth ``d``, level by level.

    Example: ``static_parents([2, 2]) == [-1, -1, 0, 0, 1, 1]``.
    """
    parents: list[int] = []
    level = [-1]
    for width in widths:
        start = len(parents)
        parents.extend(parent for parent in level for _ in range(width))
        level = list(range(start, len(parents)))
    return parents


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node: 1 below the root. ``[-1, -1, 0] -> [1, 1, 2]``."""
    depths: list[int] = []
    for i, parent in enumerate(parents):
        assert parent < i, f"node {i} has parent {parent}: parents must come before children"
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """Children of every node, in node order; key -1 is the root.

    Example: ``[-1, -1, 0] -> {-1: [0, 1], 0: [2], 1: [], 2: []}``.
    """
    children: dict[int, list[int]] = {node: [] for node in range(-1, len(parents))}
    for i, parent in enumerate(parents):
        children[parent].append(i)
    return children


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """``[N, N]`` bool: row ``i`` is True at ``i`` and at each of its ancestors (the example's z: x, z)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]  # the parent's row is complete: parents come first
    return mask


def follow(tokens: Sequence[int], parents: Sequence[int], continuation: Sequence[int]) -> list[int]:
    """The longest root-to-node path whose tokens start ``continuation``.

    Where siblings repeat a token the first is taken: the two have the same context, hence the
    same keys and values. Example: tokens ``[x, y, z]``, parents ``[-1, -1, 0]``: the
    continuation ``x z w`` follows nodes ``[0, 2]``, ``y q`` follows ``[1]``, ``w`` follows ``[]``.
    """
    children = children_of(parents)
    path: list[int] = []
    node = -1
    for token in continuation:
        node = next((c for c in children[node] if tokens[c] == token), None)
        if node is None:
            break
        path.append(node)
    return path


def forward_layout(
    cached: int, tail: int, parents: Sequence[int], first_node: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and positions of one forward that feeds sequence tokens, then tree nodes.

    Before the forward, the KV cache holds ``cached`` sequence tokens (positions ``0..cached-1``)
    followed by tree nodes ``0..first_node-1`` (only when ``tail == 0``: a tree is built on a
    complete sequence). The forward feeds ``tail`` more sequence tokens, the last of which (or,
    with ``tail == 0``, the last cached one) is the root, then nodes ``first_node..N-1``.

    Returns:
        ``[tail + N - first_node, cached + tail + N]`` bool mask (True: may attend), over the
        keys of the cache followed by the fed tokens; and ``[tail + N - first_node]`` int64
        positions. See the module docstring for a worked example.
    """
    assert tail == 0 or first_node == 0, "a tree hangs below a complete sequence"
    n = len(parents)
    length = cached + tail  # the sequence, root included
    rows = tail + n - first_node
    mask = torch.zeros(rows, length + n, dtype=torch.bool)
    # Sequence tokens: ordinary causal attention.
    mask[:tail, :length] = torch.ones(tail, length, dtype=torch.bool).tril(cached)
    # Nodes: the whole sequence, then their ancestors and themselves.
    mask[tail:, :length] = True
    mask[tail:, length:] = ancestor_mask(parents)[first_node:]
    depths = torch.tensor(node_depths(parents)[first_node:], dtype=torch.long)
    positions = torch.cat([torch.arange(cached, length), length - 1 + depths])
    return mask, positions


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[R, C]`` bool mask (True: may attend) -> ``[1, 1, R, C]`` additive float mask.

    0 where attending, the dtype's minimum elsewhere: eager attention adds it to the scores and
    sdpa takes it as is.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)[None, None]

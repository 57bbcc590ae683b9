"""Prompt-lookup trees: the continuations of several n-gram matches, merged into one tree."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.errors import InvalidParameterError
from quickdraft.processing import LogitsProcessor
from quickdraft.tree import TreeSpec


class PromptLookupTreeDrafter:
    """N-gram matching as in ``PromptLookupDrafter``, keeping several matches as branches.

    Matches are taken longest n-gram first, most recent first, and the tokens that followed
    each one (up to the tree's depth) are inserted into a trie, so continuations that share a
    beginning share nodes, until ``spec.root_branches`` distinct continuations or
    ``spec.max_nodes`` nodes. Tokens are deterministic: one-hot ``q`` for verification.

    Example (``max_ngram=1``, depth 2): the sequence ``a b a c a`` ends in ``a``, found at
    positions 2 and 0, followed by ``c a`` and ``b a``: the tree is ``c ─ a`` and ``b ─ a`` below
    the root, tokens ``[c, a, b, a]``, parents ``[-1, 0, -1, 2]``.
    """

    name = "ngram-tree"
    forwards = 0
    positions = 0

    def __init__(self, spec: TreeSpec, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        self.spec = spec
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

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
        depth = min(self.spec.max_depth, k)
        seq = torch.tensor(sequence, dtype=torch.long)  # [L]
        tokens: list[int] = []
        parents: list[int] = []
        edges: dict[tuple[int, int], int] = {}  # (parent, token) -> node: the trie
        branches = 0
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            # windows[i] = seq[i : i + n]; the last window is the suffix itself, so skip it.
            windows = seq.unfold(0, n, 1)[:-1]  # [L - n, n]
            hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()  # host sync: search result
            for start in reversed((hits + n).tolist()):
                node, added = -1, False
                for token in seq[start : start + depth].tolist():
                    if (node, token) not in edges:
                        if len(tokens) == self.spec.max_nodes:
                            break
                        edges[node, token] = len(tokens)
                        tokens.append(token)
                        parents.append(node)
                        added = True
                    node = edges[node, token]
                branches += added
                if branches == self.spec.root_branches or len(tokens) == self.spec.max_nodes:
                    return self._draft(tokens, parents)
        return self._draft(tokens, parents)

    @staticmethod
    def _draft(tokens: list[int], parents: list[int]) -> Draft:
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long),
            parents=torch.tensor(parents, dtype=torch.long),
        )

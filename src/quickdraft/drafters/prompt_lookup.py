"""Prompt lookup: propose what followed earlier occurrences of the sequence's last n-gram.

No model, one-hot q. Chains take the most recent match; trees merge several matches'
continuations into one trie. A chain is one dictionary look-up per n-gram size in an index
kept up to date as the sequence grows (``NgramIndex``), so a batch of rows pays a constant cost
per token each, not a scan of its sequence each step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, DrafterBase
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.tree import TreeSpec


def continuations(sequence: Sequence[int], max_ngram: int, min_ngram: int) -> Iterator[int]:
    """Where the tokens after each earlier match of the sequence's end start: longest n-gram
    first (``max_ngram`` down to ``min_ngram``), most recent match first.

    Example with ``max_ngram=2``: ``a b c d a b`` ends in ``a b``, also at position 0, so the
    first start is 2 (``c d a b`` follows); then ``b`` alone matches at 1, start 2 again.
    """
    seq = torch.tensor(sequence, dtype=torch.long)  # [L]
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        # windows[i] = seq[i : i + n]; the last window is the suffix itself, so skip it.
        windows = seq.unfold(0, n, 1)[:-1]  # [L - n, n]
        hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()  # host sync: search result
        yield from reversed((hits + n).tolist())


class NgramIndex:
    """The n-grams (``min_ngram`` to ``max_ngram`` tokens) of one sequence and what followed them.

    Example (``max_ngram=2``): after ``a b c d a b``, the suffix ``a b`` last occurred earlier at
    position 0, followed by ``c``: ``propose(3)`` returns ``[c, d, a]``, as ``continuations``'
    first start does.
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


class PromptLookupDrafter(DrafterBase):
    """N-gram matching in the prompt and the text generated so far; no model, one-hot q.

    A chain (``tree=None``) is what followed the most recent match of the longest n-gram.
    Example with ``max_ngram=2``: sequence ``a b c d a b`` ends in ``a b``, which also occurs at
    position 0, followed by ``c d a b``: the draft for k=3 is ``c d a``.

    A tree keeps several matches as branches: the tokens that followed each (up to the tree's
    depth), in ``continuations`` order, go into a trie, so continuations that share a beginning
    share nodes, until ``tree.root_branches`` distinct continuations or ``tree.max_nodes``
    nodes. Example (``max_ngram=1``, depth 2): ``a b a c a`` ends in ``a``, found at positions 2
    and 0, followed by ``c a`` and ``b a``: tokens ``[c, a, b, a]``, parents ``[-1, 0, -1, 2]``.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, tree: TreeSpec | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tree = tree
        self.name = "ngram" if tree is None else "ngram-tree"
        self._index = NgramIndex((), max_ngram, min_ngram)  # the last sequence a chain was asked for

    def fork(self, scope: str | None = None) -> PromptLookupDrafter:
        """Another drafter with these settings and an index of its own. ``scope`` (a request's,
        ``lookup_first.Lookup``) changes nothing: prompt lookup reads only its own sequence."""
        return PromptLookupDrafter(self.max_ngram, self.min_ngram, self.tree)

    def sync(self, sequence: Sequence[int]) -> None:
        """Nothing to do: the index reads the sequence when a chain is asked for (``chain_ids``)."""

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor | None = None,
    ) -> Draft:
        if self.tree is None:
            return self.chain(sequence, k)
        return self._tree(sequence, min(self.tree.max_depth, k), self.tree)

    def chain(self, sequence: Sequence[int], k: int) -> Draft:
        """The k tokens after the most recent match of the longest n-gram (fewer, or none)."""
        return Draft(tokens=torch.tensor(self.chain_ids(sequence, k), dtype=torch.long))

    def chain_ids(self, sequence: Sequence[int], k: int) -> list[int]:
        """``chain``'s tokens as a list. The index follows a growing sequence; one that does not
        continue the last (a new prompt, a sample of ``n``) is indexed anew."""
        indexed = self._index.tokens
        if len(sequence) < len(indexed) or list(sequence[: len(indexed)]) != indexed:
            self._index = NgramIndex(sequence, self.max_ngram, self.min_ngram)
        else:
            self._index.extend(sequence[len(indexed):])
        return self._index.propose(k)

    def _tree(self, sequence: Sequence[int], depth: int, spec: TreeSpec) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        edges: dict[tuple[int, int], int] = {}  # (parent, token) -> node: the trie
        branches = 0
        for start in continuations(sequence, self.max_ngram, self.min_ngram):
            node, added = -1, False
            for token in sequence[start : start + depth]:
                if (node, token) not in edges:
                    if len(tokens) == spec.max_nodes:
                        break
                    edges[node, token] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                    added = True
                node = edges[node, token]
            branches += added
            if branches == spec.root_branches or len(tokens) == spec.max_nodes:
                break
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))


def build(argument: str, target: LoadedModel, tree: TreeSpec | None) -> PromptLookupDrafter:
    """``draft="ngram"`` (the registry's entry; no argument)."""
    if argument:
        raise InvalidParameterError(f"'ngram' takes no argument, got 'ngram:{argument}'")
    return PromptLookupDrafter(tree=tree)

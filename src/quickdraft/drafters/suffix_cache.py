"""A cache of recent requests' tokens that drafts what followed the same text before.

Users repeat themselves: a chat resends its history each turn, an agent resends tool output and
files, a code assistant rewrites the function it was given. ``SuffixCache`` holds the token
sequences of recent requests (prompts and outputs, extended as tokens are accepted) and drafts,
for a context, the continuation that most often followed the context's end in them.

Structure: each sequence is an ``array('i')``; an index maps every bigram to the places it
occurs, packed as ``serial << 32 | offset`` in an ``array('q')`` (8 bytes a place). A lookup takes
the places of the context's last bigram (the newest ``max_candidates``), measures how far back
each agrees with the context (up to ``max_match``), keeps the longest agreements (at least
``min_match`` tokens), and walks
forward: at each position the token most of the kept places continue with is drafted while its
share of them stays at least ``min_share``, and only the places that agree stay. The length
follows the match: at most ``length_per_matched_token`` tokens per token matched.

Memory is counted as Python reports it (``sys.getsizeof`` of every array, key and the index's
dict) and bounded: past ``max_bytes`` the oldest sequences are dropped, down to ``KEEP`` of the
budget, and their index places purged in one pass (the purge walks the whole index, so it runs
once per ``1 - KEEP`` of the budget that arrives, not per sequence). Most of a sequence's memory is
its index places and keys, which only the purge frees: each sequence's share is counted as it is
added, so that the drop stops at ``KEEP`` instead of emptying the cache. The total (live and
stale) never exceeds ``max_bytes`` after an update returns.

Scopes: ``SuffixCacheStore`` keeps one cache per scope (the server's, or one per API key) under
one memory budget, dropping the oldest sequence of any scope first; a scope's drafts come only
from its own sequences.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, DrafterBase, Footprint
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.tree import TreeSpec

_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
# Bigram keys pack two token ids into one int (ids are below 2**31 in every vocabulary).
_KEY_SHIFT = 31
# What one index place and one token cost before their array grows (the arrays over-allocate;
# getsizeof counts that too, so the running total stays what Python holds).
_EMPTY_INDEX = sys.getsizeof(array("q"))
_EMPTY_TOKENS = sys.getsizeof(array("i"))
# The share of the budget kept when the bound is reached (module docstring).
KEEP = 0.75


@dataclass(frozen=True)
class SuffixMatch:
    """A draft from the cache and what it rests on.

    Attributes:
        tokens: the drafted continuation (possibly empty).
        matched: how many of the context's last tokens the kept places agree with.
        support: how many places continued with the first drafted token.
    """

    tokens: list[int]
    matched: int
    support: int


class SuffixCache:
    """Recent token sequences, indexed by bigram, drafting the most frequent continuation.

    Args:
        max_bytes: the memory bound (module docstring).
        max_candidates: places of the context's last bigram examined per lookup, newest first.
        max_match: how far back a place's agreement with the context is measured.
        min_match: the least agreement that drafts: a bigram shared with another request is
            weak evidence (common phrases), and the drafter's own fallback, prompt lookup, covers
            short matches within the request's own text.
        min_share: a drafted token's least share of the places still agreeing.
        length_per_matched_token: at most this many tokens drafted per token matched.
        serials: where sequence numbers come from; a ``SuffixCacheStore`` shares one among its
            scopes so that "oldest" compares across them.
    """

    def __init__(self, max_bytes: int, max_candidates: int = 64, max_match: int = 32, min_match: int = 4,
                 min_share: float = 0.5, length_per_matched_token: float = 2.0,
                 serials: Iterator[int] | None = None) -> None:
        if max_bytes <= 0:
            raise InvalidParameterError(f"the suffix cache needs a positive memory bound, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self.max_candidates = max_candidates
        self.max_match = max_match
        self.min_match = max(2, min_match)
        self.min_share = min_share
        self.length_per_matched_token = length_per_matched_token
        self._sequences: OrderedDict[int, array] = OrderedDict()  # serial -> tokens, oldest first
        self._index: dict[int, array] = {}  # bigram key -> packed places
        self._serials = serials if serials is not None else itertools.count()
        self._bytes = sys.getsizeof(self._index)
        self._owned: dict[int, int] = {}  # serial -> the bytes its tokens, places and new keys added
        self._reclaimable = 0  # what purging frees: the index share of dropped sequences
        self.lookups = 0
        self.hits = 0

    @property
    def bytes(self) -> int:
        """Memory held now (sequences, index, keys), as ``sys.getsizeof`` counts it."""
        return self._bytes

    @property
    def sequences(self) -> int:
        return len(self._sequences)

    @property
    def reclaimable(self) -> int:
        """Bytes that ``purge`` frees (an estimate: a key another sequence shares stays)."""
        return self._reclaimable

    def add(self, tokens: Sequence[int]) -> int:
        """Start a sequence (a request's prompt); returns its handle for ``extend``."""
        serial = next(self._serials)
        self._sequences[serial] = array("i")
        self._owned[serial] = 0
        self._bytes += _EMPTY_TOKENS
        self._append(serial, tokens)
        self._bound()
        return serial

    def extend(self, handle: int, tokens: Sequence[int]) -> None:
        """Append accepted tokens to a sequence; a sequence dropped meanwhile stays dropped."""
        if handle in self._sequences and tokens:
            self._append(handle, tokens)
            self._bound()

    def draft(self, context: Sequence[int], k: int) -> SuffixMatch:
        """Up to ``k`` tokens that most often followed the end of ``context`` (module docstring)."""
        self.lookups += 1
        none = SuffixMatch([], 0, 0)
        if k <= 0 or len(context) < 2:
            return none
        places = self._index.get(self._key(context[-2], context[-1]))
        if not places:
            return none
        # Newest first; each place is where the tokens after the bigram start.
        candidates: list[tuple[array, int, int]] = []  # (tokens, start of continuation, agreement)
        for packed in reversed(places):
            tokens = self._sequences.get(packed >> _OFFSET_BITS)
            if tokens is None:
                continue  # a dropped sequence's place, purged later
            start = packed & _OFFSET_MASK
            if start >= len(tokens):
                continue  # the context's own end: nothing follows yet
            candidates.append((tokens, start, self._agreement(tokens, start, context)))
            if len(candidates) == self.max_candidates:
                break
        if not candidates:
            return none
        matched = max(agreement for _, _, agreement in candidates)
        if matched < self.min_match:
            return none
        kept = [(tokens, start) for tokens, start, agreement in candidates if agreement == matched]
        limit = min(k, max(1, int(self.length_per_matched_token * matched)))
        drafted: list[int] = []
        support = 0
        for step in range(limit):
            counts: dict[int, int] = {}
            for tokens, start in kept:
                if start + step < len(tokens):
                    token = tokens[start + step]
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token, count = max(counts.items(), key=lambda item: item[1])
            if count < self.min_share * len(kept):
                break
            if step == 0:
                support = count
            drafted.append(token)
            kept = [(tokens, start) for tokens, start in kept
                    if start + step < len(tokens) and tokens[start + step] == token]
        if drafted:
            self.hits += 1
        return SuffixMatch(drafted, matched, support)

    def _agreement(self, tokens: array, start: int, context: Sequence[int]) -> int:
        """How many tokens before ``start`` in ``tokens`` equal the end of ``context`` (at least 2)."""
        n = 2
        limit = min(self.max_match, start, len(context))
        while n < limit and tokens[start - n - 1] == context[-n - 1]:
            n += 1
        return n

    @staticmethod
    def _key(first: int, second: int) -> int:
        return (first << _KEY_SHIFT) | second

    def _append(self, serial: int, new: Sequence[int]) -> None:
        total_before = self._bytes
        tokens = self._sequences[serial]
        before = sys.getsizeof(tokens)
        offset = len(tokens)
        tokens.extend(int(t) for t in new)
        self._bytes += sys.getsizeof(tokens) - before
        # Index every bigram that ends at a new token: its place is the token after it.
        for end in range(max(offset, 1), len(tokens)):
            key = self._key(tokens[end - 1], tokens[end])
            places = self._index.get(key)
            if places is None:
                dict_before = sys.getsizeof(self._index)
                places = self._index[key] = array("q")
                self._bytes += sys.getsizeof(self._index) - dict_before + _EMPTY_INDEX + sys.getsizeof(key)
            before = sys.getsizeof(places)
            places.append((serial << _OFFSET_BITS) | (end + 1))
            self._bytes += sys.getsizeof(places) - before
        self._owned[serial] += self._bytes - total_before

    @property
    def oldest(self) -> int | None:
        """The serial of the oldest sequence held, None when empty."""
        return next(iter(self._sequences), None)

    def drop_oldest(self) -> None:
        """Drop the oldest sequence: its tokens now, its index places at the next ``purge``."""
        serial, tokens = self._sequences.popitem(last=False)
        self._bytes -= sys.getsizeof(tokens)
        self._reclaimable += self._owned.pop(serial) - sys.getsizeof(tokens) + _EMPTY_TOKENS

    def _bound(self) -> None:
        shed([self], self.max_bytes)

    def purge(self) -> None:
        """Rebuild every index array without the places of dropped sequences."""
        live = self._sequences
        dict_before = sys.getsizeof(self._index)
        for key in list(self._index):
            places = self._index[key]
            kept = array("q", (p for p in places if (p >> _OFFSET_BITS) in live))
            self._bytes -= sys.getsizeof(places)
            if kept:
                self._index[key] = kept
                self._bytes += sys.getsizeof(kept)
            else:
                del self._index[key]
                self._bytes -= sys.getsizeof(key)
        # A dict does not shrink when keys are deleted; a copy is sized for what it holds.
        self._index = dict(self._index)
        self._bytes += sys.getsizeof(self._index) - dict_before
        self._reclaimable = 0


def shed(caches: Sequence[SuffixCache], max_bytes: int) -> None:
    """Drop the oldest sequences of any of ``caches`` and purge, until their total fits
    ``max_bytes``: down to ``KEEP`` of it by the estimate, then again if the estimate fell short."""
    while sum(cache.bytes for cache in caches) > max_bytes:
        while True:
            holding = [cache for cache in caches if cache.oldest is not None]
            if not holding:
                break
            min(holding, key=lambda cache: cache.oldest).drop_oldest()
            if sum(cache.bytes - cache.reclaimable for cache in caches) <= KEEP * max_bytes:
                break
        for cache in caches:
            if cache.reclaimable:
                cache.purge()
        if all(cache.oldest is None for cache in caches):
            return


class SuffixCacheStore:
    """One ``SuffixCache`` per scope under one memory budget (module docstring).

    Args:
        max_bytes: the budget of all scopes together.
        options: ``SuffixCache`` keyword arguments for every scope.
    """

    def __init__(self, max_bytes: int, **options) -> None:
        if max_bytes <= 0:
            raise InvalidParameterError(f"the suffix cache needs a positive memory bound, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self._options = options
        self._serials = itertools.count()
        self._caches: dict[str, SuffixCache] = {}

    @property
    def bytes(self) -> int:
        return sum(cache.bytes for cache in self._caches.values())

    @property
    def sequences(self) -> int:
        return sum(cache.sequences for cache in self._caches.values())

    @property
    def lookups(self) -> int:
        return sum(cache.lookups for cache in self._caches.values())

    @property
    def hits(self) -> int:
        return sum(cache.hits for cache in self._caches.values())

    def scope(self, name: str) -> SuffixCache:
        """The cache of scope ``name``, made on first use."""
        cache = self._caches.get(name)
        if cache is None:
            # Each scope's own bound is the whole budget: the store enforces the shared one.
            cache = self._caches[name] = SuffixCache(self.max_bytes, serials=self._serials, **self._options)
        return cache

    def add(self, name: str, tokens: Sequence[int]) -> int:
        handle = self.scope(name).add(tokens)
        self._bound()
        return handle

    def extend(self, name: str, handle: int, tokens: Sequence[int]) -> None:
        self.scope(name).extend(handle, tokens)
        self._bound()

    def _bound(self) -> None:
        shed(list(self._caches.values()), self.max_bytes)


DEFAULT_SUFFIX_CACHE_MB = 256
SERVER_SCOPE = "server"


class SuffixDrafter(DrafterBase):
    """Drafts from a ``SuffixCacheStore``: what followed the sequence's end in earlier requests
    of its scope and in its own text, else prompt lookup's copy from its own text.

    Every fork (one per row of the batched engine, ``fork``) holds its sequence in the store and
    adds the tokens accepted since its last draft, so concurrent requests draft from each other as
    they decode. One-hot q, a chain; it costs no model forward. In front of a draft model it is
    the free copy (``PromptLookupFirst(drafter, lookup=SuffixDrafter(store))``).

    Args:
        store: the shared cache (its memory bound covers every fork).
        scope: whose sequences this fork drafts from and adds to (``SERVER_SCOPE``, or one per
            API key).
    """

    name = "suffix"

    def __init__(self, store: SuffixCacheStore, scope: str = SERVER_SCOPE) -> None:
        self.store = store
        self.scope = scope
        self._own = PromptLookupDrafter()
        self._handle: int | None = None
        self._known: list[int] = []  # the sequence as the store holds it

    def fork(self, scope: str | None = None) -> SuffixDrafter:
        """A drafter for another request, in ``scope`` (default: this one's), sharing the store."""
        return SuffixDrafter(self.store, self.scope if scope is None else scope)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._handle = self.store.add(self.scope, prompt_ids)
        self._known = [int(t) for t in prompt_ids]

    def sync(self, sequence: Sequence[int]) -> None:
        """Put the sequence's new tokens in the store; a sequence that does not continue the last
        one (the library's next prompt, the next of ``n`` samples) starts a new one."""
        known = len(self._known)
        if self._handle is None or len(sequence) < known or list(sequence[:known]) != self._known:
            self.begin(sequence)
        elif len(sequence) > known:
            new = [int(t) for t in sequence[known:]]
            self.store.extend(self.scope, self._handle, new)
            self._known.extend(new)

    def chain_ids(self, sequence: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens: the cache's draft, else prompt lookup's from the sequence itself."""
        self.sync(sequence)
        tokens = self.store.scope(self.scope).draft(sequence, k).tokens
        return tokens if tokens else self._own.chain_ids(sequence, k)

    def chain(self, sequence: Sequence[int], k: int) -> Draft:
        return Draft(tokens=torch.tensor(self.chain_ids(sequence, k), dtype=torch.long))

    def propose(self, sequence: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None,
                processor: LogitsProcessor | None = None) -> Draft:
        return self.chain(sequence, k)

    def footprint(self) -> Footprint:
        return Footprint(note=f"suffix cache, up to {self.store.max_bytes / (1 << 20):,.0f} MiB")


def build(argument: str, target: LoadedModel, tree: TreeSpec | None) -> SuffixDrafter:
    """``draft="suffix"`` or ``"suffix:MB"`` (the registry's entry): a drafter over a new store."""
    if tree is not None:
        raise InvalidParameterError("'suffix' drafts chains: drop tree= (or --tree / --tree-budget)")
    megabytes = DEFAULT_SUFFIX_CACHE_MB
    if argument:
        try:
            megabytes = float(argument)
        except ValueError:
            raise InvalidParameterError(f"'suffix:MB' takes the cache's size in MiB, got 'suffix:{argument}'") from None
    return SuffixDrafter(SuffixCacheStore(int(megabytes * (1 << 20))))

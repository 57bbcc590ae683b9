"""The suffix cache: what it drafts from earlier sequences, its memory bound, and its scopes."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from quickdraft.drafters.suffix_cache import SuffixCache, SuffixCacheStore
from quickdraft.errors import InvalidParameterError

MB = 1 << 20


def test_drafts_what_followed_the_context_in_an_earlier_sequence() -> None:
    cache = SuffixCache(MB, min_match=2)
    cache.add([10, 11, 12, 13, 14, 15, 16])
    match = cache.draft([99, 12, 13], 3)
    assert match.tokens == [14, 15, 16]
    assert match.matched == 2 and match.support == 1


def test_the_most_frequent_continuation_wins_and_disagreement_stops_the_draft() -> None:
    cache = SuffixCache(MB, min_match=2, min_share=0.6)
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 5]):
        cache.add([1, 2, 3, *tail])
    # 7 follows in all three places; then 8 in two of three (0.67 >= 0.6); then 9 in both kept.
    assert cache.draft([1, 2, 3], 5).tokens == [7, 8, 9]
    cache.add([1, 2, 3, 7, 6, 6])  # now 8 follows 7 in two of four: below the share
    assert cache.draft([1, 2, 3], 5).tokens == [7]


def test_a_longer_agreement_with_the_context_outranks_frequency() -> None:
    cache = SuffixCache(MB, min_match=2)
    cache.add([5, 6, 1, 2, 40])
    cache.add([9, 6, 1, 2, 50])
    cache.add([8, 6, 1, 2, 50])
    # The context ends in 5 6 1 2: only the first sequence agrees over four tokens.
    match = cache.draft([5, 6, 1, 2], 1)
    assert match.tokens == [40] and match.matched == 4


def test_the_draft_length_follows_the_match() -> None:
    cache = SuffixCache(MB, min_match=2, length_per_matched_token=1.0)
    cache.add(list(range(100, 130)))
    assert len(cache.draft([0, 105, 106], 20).tokens) == 2  # matched 2 tokens: at most 2
    assert len(cache.draft(list(range(100, 110)), 20).tokens) == 10  # matched 10


def test_a_sequence_drafts_from_its_own_earlier_text_but_not_its_own_end() -> None:
    cache = SuffixCache(MB, min_match=2)
    own = cache.add([1, 2, 3, 4, 1, 2])
    assert cache.draft([1, 2, 3, 4, 1, 2], 2).tokens == [3, 4]  # prompt lookup, in effect
    cache.extend(own, [3])
    assert cache.draft([1, 2, 3, 4, 1, 2, 3], 2).tokens == [4, 1]
    assert cache.draft([7, 8], 2).tokens == []


def test_extending_a_sequence_makes_its_new_tokens_draftable() -> None:
    cache = SuffixCache(MB, min_match=2)
    handle = cache.add([1, 2])
    assert cache.draft([1, 2], 3).tokens == []
    cache.extend(handle, [3, 4, 5])
    assert cache.draft([0, 1, 2], 3).tokens == [3, 4, 5]
    assert cache.draft([9, 3, 4], 1).tokens == [5]


def test_memory_is_counted_as_python_holds_it() -> None:
    rng = random.Random(0)
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    cache = SuffixCache(64 * MB)
    for _ in range(50):
        cache.add([rng.randrange(5000) for _ in range(400)])
    held = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    assert 0.75 * held <= cache.bytes <= 1.25 * held


def test_the_memory_bound_holds_and_the_oldest_sequences_go_first() -> None:
    rng = random.Random(1)
    cache = SuffixCache(200_000)
    first = [rng.randrange(50_000) for _ in range(300)]
    cache.add(first)
    assert cache.draft(first[:50], 5).tokens == first[50:55]
    peak, low = 0, cache.max_bytes
    for _ in range(200):
        handle = cache.add([rng.randrange(50_000) for _ in range(100)])
        for _ in range(3):
            cache.extend(handle, [rng.randrange(50_000) for _ in range(50)])
            peak = max(peak, cache.bytes)
            if peak > 0.9 * cache.max_bytes:
                low = min(low, cache.bytes)
    assert peak <= cache.max_bytes
    assert cache.draft(first[:50], 5).tokens == []  # the oldest was dropped
    assert 0 < cache.sequences < 201
    # Once full, a drop keeps most of the budget: not the newest sequence alone (the index
    # places and keys, most of a sequence's memory, are freed only by the purge).
    assert low >= 0.5 * cache.max_bytes  # KEEP, less one sequence of about a fifth of the budget


def test_scopes_never_draft_from_each_other() -> None:
    store = SuffixCacheStore(MB, min_match=2)
    secret = [11, 12, 13, 14, 15, 16]
    store.add("key-a", secret)
    assert store.scope("key-a").draft([11, 12, 13], 3).tokens == [14, 15, 16]
    assert store.scope("key-b").draft([11, 12, 13], 3).tokens == []
    store.add("key-b", [1, 11, 12, 13, 99])
    assert store.scope("key-b").draft([11, 12, 13], 1).tokens == [99]
    assert store.scope("key-a").draft([11, 12, 13], 1).tokens == [14]


def test_the_store_bound_drops_the_oldest_sequence_of_any_scope() -> None:
    rng = random.Random(2)
    store = SuffixCacheStore(300_000)
    old = [rng.randrange(50_000) for _ in range(200)]
    store.add("a", old)
    low = store.max_bytes
    for i in range(100):
        store.add("b" if i % 2 else "c", [rng.randrange(50_000) for _ in range(200)])
        assert store.bytes <= store.max_bytes
        if i > 50:
            low = min(low, store.bytes)
    assert low >= 0.5 * store.max_bytes
    assert store.scope("a").draft(old[:20], 3).tokens == []


def test_an_agreement_shorter_than_min_match_drafts_nothing() -> None:
    cache = SuffixCache(MB, min_match=4)
    cache.add([1, 2, 3, 4, 5, 6])
    assert cache.draft([9, 9, 3, 4], 2).tokens == []  # 2 tokens agree
    assert cache.draft([1, 2, 3, 4], 2).tokens == [5, 6]  # 4 agree
    assert cache.lookups == 2 and cache.hits == 1


def test_a_bound_that_is_not_positive_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="positive memory bound"):
        SuffixCache(0)
    with pytest.raises(InvalidParameterError, match="positive memory bound"):
        SuffixCacheStore(-1)


# ---- the drafter: lossless on the library's loop and the batched engine -------------------------

from conftest import chi_square_p_value, exact_continuation_probs  # noqa: E402
from helpers import LENGTH, PROMPT, PROMPTS, plain_greedy, sample_counts  # noqa: E402
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder  # noqa: E402
from quickdraft.batch import BatchEngine  # noqa: E402
from quickdraft.drafters.suffix_cache import SuffixDrafter  # noqa: E402


def test_the_library_drafts_from_its_earlier_generations_and_stays_greedy(tiny_target, tiny_draft) -> None:
    store = SuffixCacheStore(MB)
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, 3, policy=FixedK(3), lookup=SuffixDrafter(store))
    params = SamplingParams(max_new_tokens=24)
    first = decoder.generate(PROMPTS[0], params)
    again = decoder.generate(PROMPTS[0], params)  # the cache holds the first answer now
    assert first.token_ids == again.token_ids == plain_greedy(tiny_target, PROMPTS[0], 24)
    assert again.stats.steps < first.stats.steps  # whole runs of the first answer copied
    assert store.hits > 0 and store.sequences == 2


def test_draft_suffix_alone_is_the_target_s_greedy_output(tiny_target) -> None:
    decoder = SpeculativeDecoder(tiny_target, "suffix", 3, policy=FixedK(3))
    for prompt in PROMPTS * 2:
        out = decoder.generate(prompt, SamplingParams(max_new_tokens=20))
        assert out.token_ids == plain_greedy(tiny_target, prompt, 20)
    assert out.stats.accepted_tokens > 0


def test_batched_rows_draft_from_each_other_and_each_stays_greedy(tiny_target, tiny_draft) -> None:
    store = SuffixCacheStore(MB)
    engine = BatchEngine(tiny_target, tiny_draft, 3, prompt_lookup=SuffixDrafter(store))
    ids = {engine.add(prompt, SamplingParams(max_new_tokens=16)): prompt for prompt in PROMPTS * 2}
    out: dict[int, list[int]] = {i: [] for i in ids}
    while engine.rows:
        for event in engine.step():
            out[event.request_id].extend(event.chunk.token_ids)
    assert all(out[i] == plain_greedy(tiny_target, ids[i], 16) for i in ids)
    assert store.sequences == len(ids) and store.hits > 0


@pytest.mark.slow
def test_suffix_copies_in_front_of_a_draft_model_keep_the_target_s_distribution(tiny_target, tiny_draft) -> None:
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    # Every run adds its sample to the cache, so later runs are offered the most frequent
    # continuation so far: one-hot copies mixed with the draft model's sampled tokens (a 2-token
    # agreement drafts: the prompt is 2 tokens long).
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, 2, policy=FixedK(2),
                                 lookup=SuffixDrafter(SuffixCacheStore(MB, min_match=2)))
    lookup_steps: list[int] = []
    counts = sample_counts(decoder, params, tiny_target.vocab_size, lookup_steps)
    assert chi_square_p_value(counts, exact) > 1e-3
    assert sum(n > 0 for n in lookup_steps) > len(lookup_steps) // 2
    wrong = exact_continuation_probs(tiny_draft, PROMPT, LENGTH, params(0))
    assert chi_square_p_value(counts, wrong) < 1e-6

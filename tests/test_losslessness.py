"""End to end: speculative sampling reproduces the target's distribution over whole continuations.

With a vocabulary of 8 and 3 new tokens (so at most K = 2 drafts per step: the loop never
drafts past ``max_new_tokens``) there are 512 continuations; their exact probability
under the target alone is computed by enumeration (a forward over every prefix), and the
empirical distribution of thousands of seeded speculative runs is tested against it.
"""

from __future__ import annotations

import pytest

from conftest import chi_square_p_value, exact_continuation_probs
from helpers import LENGTH, PROMPT, SAMPLES, sample_counts
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder

CASES = [
    # temperature, top_k, top_p, K, prompt lookup before the draft model (the default)
    (1.0, 0, 1.0, 2, False),
    (0.6, 0, 0.85, 2, True),
    (1.4, 3, 0.9, 1, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,k,lookup", CASES)
def test_draft_model_sampling_matches_the_target(tiny_target, tiny_draft, temperature, top_k, top_p, k, lookup):
    params = lambda seed: SamplingParams(  # noqa: E731
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=LENGTH, seed=seed
    )
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=k, policy=FixedK(k),
                                 prompt_lookup=lookup)
    lookup_steps: list[int] = []
    counts = sample_counts(decoder, params, tiny_target.vocab_size, lookup_steps)
    assert chi_square_p_value(counts, exact) > 1e-3
    # With lookup on, many runs mix one-hot lookup drafts with the draft model's sampled ones.
    runs_with_lookup = sum(n > 0 for n in lookup_steps)
    assert (runs_with_lookup > SAMPLES // 10) if lookup else runs_with_lookup == 0, runs_with_lookup
    # The same samples against the draft's distribution must fail: the test has the power to
    # see a sampler that follows the wrong model.
    wrong = exact_continuation_probs(tiny_draft, PROMPT, LENGTH, params(0))
    assert chi_square_p_value(counts, wrong) < 1e-6


@pytest.mark.slow
def test_prompt_lookup_sampling_matches_the_target(tiny_target):
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, "ngram", num_speculative_tokens=2, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.parametrize("restriction,temperature", [
    # The draft proposes only tokens 0..3 (plus the prompt's 1 and 3): q is zero elsewhere,
    # and the target's tokens outside that set must still come out at their exact rate.
    ({"vocabulary_size": 4}, 0.9),
    # The draft sees only the prompt's last token.
    ({"context_window": 1}, 1.0),
])
@pytest.mark.slow
def test_a_draft_that_sees_part_of_the_vocabulary_or_the_prompt_keeps_the_target(
    tiny_target, tiny_draft, restriction, temperature
):
    from quickdraft.drafters import DraftModelDrafter

    params = lambda seed: SamplingParams(temperature=temperature, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    drafter = DraftModelDrafter(tiny_draft, **restriction)
    decoder = SpeculativeDecoder(tiny_target, drafter, num_speculative_tokens=2, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3

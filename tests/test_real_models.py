"""The engine on the real demo pair (Qwen2.5-Coder 1.5B target, 0.5B draft): marked, slow.

Equality runs in float32, where a K+1-token forward and a 1-token forward agree closely enough
that greedy near-ties do not flip (in bfloat16 they can; see docs/correctness.md).
"""

from __future__ import annotations

import pytest

from conftest import requires_demo
from quickdraft import SamplingParams, SpeculativeDecoder, load_model

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"

PROMPTS = [
    "def fibonacci(n):",
    "The three most important ideas in thermodynamics are",
    "Translate to French: The weather is lovely today, so we will walk to the market.",
]


@pytest.fixture(scope="module")
def demo_pair():
    return load_model(TARGET, dtype="float32"), load_model(DRAFT, dtype="float32")


@pytest.mark.real_model
@requires_demo(TARGET, DRAFT)
def test_greedy_speculation_equals_plain_greedy_on_the_demo_pair(demo_pair, real_threads):
    target, draft = demo_pair
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = SpeculativeDecoder(target, None)
    with_draft = SpeculativeDecoder(target, draft, num_speculative_tokens=5)
    lookup = SpeculativeDecoder(target, "ngram", num_speculative_tokens=5)
    for prompt in PROMPTS:
        expected = plain.generate(prompt, params)
        got = with_draft.generate(prompt, params)
        assert got.token_ids == expected.token_ids, prompt
        assert got.text == expected.text
        assert got.stats.accepted_tokens > 0
        assert lookup.generate(prompt, params).token_ids == expected.token_ids, prompt

"""The batched engine on the real demo pair (Qwen2.5-Coder 1.5B target, 0.5B draft): marked, slow.

In float32, where a batched forward and a single-row one agree closely enough that greedy
near-ties do not flip (docs/batching.md#exactness).
"""

from __future__ import annotations

import pytest

from conftest import requires_demo
from quickdraft import SamplingParams, SpeculativeDecoder, load_model
from quickdraft.batch import BatchEngine, FixedBatchK

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"

PROMPTS = [
    "def fibonacci(n):",
    "The three most important ideas in thermodynamics are",
    "Translate to French: The weather is lovely today, so we will walk to the market.",
]


@pytest.mark.real_model
@requires_demo(TARGET, DRAFT)
def test_a_batch_on_the_demo_pair_equals_each_prompt_s_plain_greedy_output(real_threads):
    target, draft = load_model(TARGET, dtype="float32"), load_model(DRAFT, dtype="float32")
    lengths = [24, 12, 18]  # rows leave at different steps
    expected = [SpeculativeDecoder(target, None).generate(p, SamplingParams(max_new_tokens=n, ignore_eos=True)).token_ids
                for p, n in zip(PROMPTS, lengths)]
    engine = BatchEngine(target, draft, num_speculative_tokens=4, policy=FixedBatchK(4))
    outputs = engine.generate_batch(PROMPTS, [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths])
    assert [out.token_ids for out in outputs] == expected
    assert sum(out.stats.accepted_tokens for out in outputs) > 0

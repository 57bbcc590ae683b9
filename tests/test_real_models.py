"""Greedy speculation on the real demo pair equals the target's own greedy output: marked, slow.

Qwen2.5-Coder 1.5B target, 0.5B draft (and SmolLM2-135M drafting for the 0.5B across
tokenizers). Every decoder here (a chain, prompt lookup, trees, the batched engine) must emit
exactly the tokens plain greedy decoding emits. The models are loaded once for the module, in
float32, where a forward over several positions and a one-token forward agree closely enough
that greedy near-ties do not flip (in bfloat16 they can; see docs/correctness.md). Each prompt's
plain greedy output is decoded once: a shorter greedy output is a prefix of a longer one.
"""

from __future__ import annotations

import pytest

from conftest import requires_demo
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder, TreeSpec, load_model
from quickdraft.batch import BatchEngine
from quickdraft.errors import TokenizerMismatchError
from quickdraft.kernels import int4_kernel
from quickdraft.models import check_tokenizers_compatible
from quickdraft.models.base import LoadedModel

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
OTHER_FAMILY = "smollm2-135m-instruct"

PROMPTS = [
    "def fibonacci(n):",
    "The three most important ideas in thermodynamics are",
    "Translate to French: The weather is lovely today, so we will walk to the market.",
]
TOKENS = 16

pytestmark = [pytest.mark.real_model, requires_demo(TARGET, DRAFT)]


@pytest.fixture(scope="module")
def demo_pair() -> tuple[LoadedModel, LoadedModel]:
    # quantization="none": the dequantized float32 model (the demo target would otherwise run
    # from its GGUF blocks, whose int8-quantized activations flip greedy near-ties more often).
    return load_model(TARGET, dtype="float32", quantization="none"), load_model(DRAFT, dtype="float32")


@pytest.fixture(scope="module")
def greedy(demo_pair):
    """``greedy(prompt, n)``: the target's own first ``n`` greedy tokens (EOS ignored)."""
    plain = SpeculativeDecoder(demo_pair[0], None)
    outputs: dict[str, list[int]] = {}

    def first(prompt: str, n: int = TOKENS) -> list[int]:
        if len(outputs.get(prompt, ())) < n:
            outputs[prompt] = plain.generate(prompt, SamplingParams(max_new_tokens=max(n, TOKENS), ignore_eos=True)).token_ids
        return outputs[prompt][:n]

    return first


def test_greedy_chains_and_prompt_lookup_equal_plain_greedy(demo_pair, greedy, real_threads):
    target, draft = demo_pair
    params = SamplingParams(max_new_tokens=TOKENS, ignore_eos=True)
    # A fixed K: the adaptive policy may rightly stop drafting on a slow or busy machine, and this
    # test is about drafted tokens being checked, not about whether drafting pays here.
    with_draft = SpeculativeDecoder(target, draft, num_speculative_tokens=5, policy=FixedK(5))
    lookup = SpeculativeDecoder(target, "ngram", num_speculative_tokens=5, policy=FixedK(5))
    for prompt in PROMPTS:
        got = with_draft.generate(prompt, params)
        assert got.token_ids == greedy(prompt), prompt
        assert got.text == target.tokenizer.decode(greedy(prompt), skip_special_tokens=True)
        assert got.stats.accepted_tokens > 0
        assert lookup.generate(prompt, params).token_ids == greedy(prompt), prompt


@pytest.mark.parametrize("quantization", ["int8", pytest.param("int4", marks=pytest.mark.skipif(
    int4_kernel() is None, reason="the int4 kernel does not run on this machine"))])
def test_a_quantized_demo_draft_keeps_plain_greedy_output(demo_pair, greedy, quantization, real_threads):
    """The draft that ``dtype="auto"`` loads on a CPU: its tokens are checked and accepted, and the
    output is the target's."""
    target = demo_pair[0]
    draft = load_model(DRAFT, quantization=quantization)
    params = SamplingParams(max_new_tokens=TOKENS, ignore_eos=True)
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=5, policy=FixedK(5), prompt_lookup=False)
    stats = []
    for prompt in PROMPTS:
        got = decoder.generate(prompt, params)
        assert got.token_ids == greedy(prompt), prompt
        assert got.stats.drafted_tokens > 0
        stats.append(got.stats)
    assert stats[0].accepted_tokens > 0  # code (``PROMPTS[0]``); the int8 draft: 11 of 22 in 16 tokens


def test_greedy_trees_equal_plain_greedy(demo_pair, greedy, real_threads):
    target, draft = demo_pair
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    decoders = [
        SpeculativeDecoder(target, draft, tree=TreeSpec(widths=(3, 2, 1)), policy=FixedK(3)),
        SpeculativeDecoder(target, draft, tree=TreeSpec(budget=10, depth=4), policy=FixedK(4)),
        SpeculativeDecoder(target, "ngram", tree=TreeSpec(widths=(3, 1, 1)), policy=FixedK(3)),
    ]
    for prompt in PROMPTS[:2]:
        for decoder in decoders:
            got = decoder.generate(prompt, params)
            assert got.token_ids == greedy(prompt, 12), (decoder.tree, decoder.drafter.name, prompt)
            if decoder.drafter.name.startswith("draft-tree"):
                assert got.stats.accepted_tokens > 0


def test_a_batch_equals_each_prompt_s_plain_greedy_output(demo_pair, greedy, real_threads):
    # In float32 a batched forward and a single-row one agree as closely (docs/batching.md#exactness).
    target, draft = demo_pair
    lengths = [16, 8, 12]  # rows leave at different steps
    engine = BatchEngine(target, draft, num_speculative_tokens=4, policy=FixedK(4))
    outputs = engine.generate_batch(PROMPTS, [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths])
    assert [out.token_ids for out in outputs] == [greedy(p, n) for p, n in zip(PROMPTS, lengths)]
    assert sum(out.stats.accepted_tokens for out in outputs) > 0


def test_the_two_qwen_models_share_a_tokenizer(demo_pair):
    check_tokenizers_compatible(*demo_pair)


@pytest.fixture(scope="module")
def other_family() -> LoadedModel:
    return load_model(OTHER_FAMILY, dtype="float32")


@requires_demo(OTHER_FAMILY)
def test_smollm2_cannot_draft_for_qwen_token_by_token(demo_pair, other_family):
    with pytest.raises(TokenizerMismatchError, match="do not share a vocabulary"):
        check_tokenizers_compatible(demo_pair[1], other_family)


@requires_demo(OTHER_FAMILY)
def test_smollm2_drafting_for_the_small_qwen_gives_its_greedy_output(demo_pair, other_family, real_threads):
    target, draft = demo_pair[1], other_family  # another tokenizer
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = SpeculativeDecoder(target, None)
    speculative = SpeculativeDecoder(target, draft, num_speculative_tokens=4, policy=FixedK(4), prompt_lookup=False)
    accepted = 0
    for prompt in ["def fibonacci(n):", "The capital of France is", "Écris une phrase en français :"]:
        out = speculative.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids, prompt
        accepted += out.stats.accepted_tokens
    assert accepted > 6  # the draft's tokens do get through

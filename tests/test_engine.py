"""The decoding loop on tiny random models: equality with plain decoding, caches, stopping."""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_model
from helpers import PROMPTS, plain_greedy
from quickdraft import (
    ContextLengthError,
    FixedK,
    InvalidParameterError,
    SamplingParams,
    SpeculativeDecoder,
    TreeSpec,
    UnsupportedModelError,
)
from quickdraft.drafters import Draft, DrafterBase
from quickdraft.engine import new_processor
from quickdraft.policy import LOOKUP, MODEL, Choice
from quickdraft.runner import ModelRunner

@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_a_draft_model_equals_plain_greedy(tiny_target, tiny_draft, prompt, k):
    out = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=k, policy=FixedK(k)).generate(
        prompt, SamplingParams(max_new_tokens=24)
    )
    assert out.token_ids == plain_greedy(tiny_target, prompt, 24)
    assert out.stats.drafted_tokens > 0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_prompt_lookup_equals_plain_greedy(tiny_target, prompt):
    out = SpeculativeDecoder(tiny_target, "ngram", num_speculative_tokens=4, policy=FixedK(4)).generate(
        prompt, SamplingParams(max_new_tokens=30)
    )
    assert out.token_ids == plain_greedy(tiny_target, prompt, 30)
    # random tiny models fall into loops, which the n-gram drafter then predicts
    assert out.stats.accepted_tokens > 0


@pytest.mark.parametrize("tree", [None, TreeSpec(widths=(2, 2, 1, 1))])
def test_a_request_limits_how_many_tokens_a_step_drafts(tiny_target, tiny_draft, tree):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=4, policy=FixedK(4), tree=tree)
    for limit in (0, 1, 2):
        out = decoder.generate(PROMPTS[0], SamplingParams(max_new_tokens=24, num_speculative_tokens=limit))
        assert out.token_ids == plain_greedy(tiny_target, PROMPTS[0], 24)
        assert len(out.stats.drafted_by_position) == limit  # deepest position drafted
        if limit == 0:
            assert out.stats.steps == 24 and out.stats.draft_forwards == 0 and out.stats.draft_positions == 0


def test_plain_decoding_is_the_same_loop(tiny_target):
    out = SpeculativeDecoder(tiny_target, None).generate([1, 2], SamplingParams(max_new_tokens=10))
    assert out.token_ids == plain_greedy(tiny_target, [1, 2], 10)
    assert out.stats.steps == 10 and out.stats.drafted_tokens == 0
    assert out.stats.mean_tokens_per_step == 1.0


def test_draft_equal_to_target_accepts_everything(tiny_target):
    for params in [SamplingParams(max_new_tokens=20), SamplingParams(temperature=0.8, max_new_tokens=20, seed=1)]:
        out = SpeculativeDecoder(tiny_target, tiny_target, num_speculative_tokens=4, policy=FixedK(4),
                                  prompt_lookup=False).generate([3, 1], params)
        assert out.stats.acceptance_rate == 1.0
        assert out.stats.mean_tokens_per_step == 5.0
        assert len(out.token_ids) == 20


def test_nothing_is_recomputed(tiny_target, tiny_draft):
    prompt = [1, 2, 3, 4]
    out = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=4, policy=FixedK(4)).generate(
        prompt, SamplingParams(max_new_tokens=33)
    )
    s = out.stats
    rejected = s.drafted_tokens - s.accepted_tokens
    # prefill of prompt[:-1] once, then each kept token exactly once, plus wasted rejections
    assert s.target_positions == (len(prompt) - 1) + s.new_tokens + rejected
    assert s.target_forwards == 1 + s.steps
    # the draft model: the prompt once, then one position per draft forward, plus one extra
    # position after each fully accepted step (the last draft token it had not seen)
    assert s.draft_positions >= (len(prompt) - 1) + s.draft_forwards - 1


def test_sampled_runs_are_reproducible_with_a_seed(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3, policy=FixedK(3))
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=25, seed=7)
    a, b = decoder.generate([1, 2], params), decoder.generate([1, 2], params)
    assert a.token_ids == b.token_ids
    other = decoder.generate([1, 2], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=25, seed=8))
    assert other.token_ids != a.token_ids


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 13])
def test_stops_exactly_at_max_new_tokens(tiny_target, n):
    out = SpeculativeDecoder(tiny_target, tiny_target, num_speculative_tokens=5, policy=FixedK(5)).generate(
        [1], SamplingParams(max_new_tokens=n)
    )
    assert len(out.token_ids) == n and out.finish_reason == "length"


def test_stops_at_eos_in_the_middle_of_an_accepted_run(tiny_target):
    expected = plain_greedy(tiny_target, [1, 2], 20)
    eos = expected[6]
    first = expected.index(eos)
    tiny_target.module.generation_config.eos_token_id = eos
    try:
        out = SpeculativeDecoder(tiny_target, tiny_target, num_speculative_tokens=5, policy=FixedK(5)).generate(
            [1, 2], SamplingParams(max_new_tokens=20)
        )
        assert out.token_ids == expected[: first + 1] and out.finish_reason == "stop"
        ignored = SpeculativeDecoder(tiny_target, tiny_target, policy=FixedK(5)).generate(
            [1, 2], SamplingParams(max_new_tokens=20, ignore_eos=True)
        )
        assert ignored.token_ids == expected
    finally:
        tiny_target.module.generation_config.eos_token_id = None


def test_rollback_leaves_logits_equal_to_a_fresh_forward(tiny_target):
    runner = ModelRunner(tiny_target)
    runner.forward([1, 2, 3, 4])
    runner.forward([5, 6, 7])  # drafts, of which only 5 is kept
    runner.truncate(5)
    cached = runner.forward([0, 2], num_logits=2)
    with torch.inference_mode():
        fresh = tiny_target.module(input_ids=torch.tensor([[1, 2, 3, 4, 5, 0, 2]])).logits[0, -2:]
    assert torch.allclose(cached, fresh, atol=1e-5)
    assert runner.cached_ids == [1, 2, 3, 4, 5, 0, 2]


def test_forward_tail_feeds_only_what_the_cache_lacks(tiny_target):
    runner = ModelRunner(tiny_target)
    runner.forward_tail([1, 2, 3, 4])
    assert runner.positions == 4
    logits = runner.forward_tail([1, 2, 3, 7, 7], num_logits=2)  # diverges after 3
    assert runner.positions == 4 + 2 and runner.cached_ids == [1, 2, 3, 7, 7]
    with torch.inference_mode():
        fresh = tiny_target.module(input_ids=torch.tensor([[1, 2, 3, 7, 7]])).logits[0, -2:]
    assert torch.allclose(logits, fresh, atol=1e-5)


def test_stream_yields_the_same_tokens_as_generate(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3, policy=FixedK(3))
    chunks = list(decoder.stream([4, 4], SamplingParams(max_new_tokens=17)))
    assert [t for c in chunks for t in c.token_ids] == decoder.generate([4, 4], SamplingParams(max_new_tokens=17)).token_ids
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in chunks[:-1])


class ScriptedDrafter(DrafterBase):
    """Proposes a fixed continuation: lets a test choose exactly what gets rejected."""

    name = "scripted"

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, sequence, k, params, generator, processor):
        return Draft(tokens=torch.tensor(self.tokens[:k]))


def test_a_custom_drafter_behind_the_protocol(tiny_target):
    expected = plain_greedy(tiny_target, [2], 12)
    out = SpeculativeDecoder(tiny_target, ScriptedDrafter(expected[:3]), num_speculative_tokens=3, policy=FixedK(3)).generate(
        [2], SamplingParams(max_new_tokens=12)
    )
    assert out.token_ids == expected
    assert out.stats.accepted_by_position[:3] == [1, 1, 1]


# ---- prompt lookup in front of a model drafter (the default) ------------------------------------

REPEATING_PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # ends in "1 2", seen before: lookup drafts "3 1 2 ..."


class RecordingPolicy(FixedK):
    """FixedK that remembers what it was told."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.observed: list[tuple[str, int, int]] = []

    def observe(self, source, drafted, accepted, draft_seconds, verify_seconds) -> None:
        self.observed.append((source, drafted, accepted))


def test_prompt_lookup_before_a_draft_model_keeps_the_greedy_output(tiny_target, tiny_draft):
    policy = RecordingPolicy(3)
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3, policy=policy)
    out = decoder.generate(REPEATING_PROMPT, SamplingParams(max_new_tokens=40))
    assert out.token_ids == plain_greedy(tiny_target, REPEATING_PROMPT, 40)
    s = out.stats
    assert 0 < s.lookup_steps < s.steps and s.lookup_accepted_tokens <= s.accepted_tokens
    # The policy sees every step, each with its source, to learn each source's acceptance.
    assert len(policy.observed) == s.steps
    assert sum(source == LOOKUP for source, _, _ in policy.observed) == s.lookup_steps
    assert "steps drafted by prompt lookup" in s.summary()


def test_prompt_lookup_defaults_to_on_for_models_only(tiny_target, tiny_draft):
    def lookup_steps(draft, **options) -> int:
        decoder = SpeculativeDecoder(tiny_target, draft, num_speculative_tokens=3, policy=FixedK(3), **options)
        return decoder.generate(REPEATING_PROMPT, SamplingParams(max_new_tokens=20)).stats.lookup_steps

    assert lookup_steps(tiny_draft) > 0
    assert lookup_steps(tiny_draft, prompt_lookup=False) == 0
    assert lookup_steps("ngram") == 0  # counted as the drafter's own steps
    assert lookup_steps(ScriptedDrafter([1, 2, 3])) == 0
    assert lookup_steps(ScriptedDrafter([1, 2, 3]), prompt_lookup=True) > 0


@pytest.mark.parametrize("draft", [None, "ngram"])
def test_prompt_lookup_with_nothing_behind_it_is_refused(tiny_target, draft):
    with pytest.raises(InvalidParameterError, match="prompt_lookup"):
        SpeculativeDecoder(tiny_target, draft, prompt_lookup=True)


@pytest.mark.parametrize("tree", [None, TreeSpec(widths=(2, 1))])
def test_a_draft_that_sees_a_window_of_the_prompt_keeps_the_greedy_output(tiny_target, tiny_draft, tree):
    from quickdraft.drafters import DraftModelDrafter

    prompt = [5, 3, 1, 4, 1, 5, 2, 6, 5, 3]
    drafter = (DraftModelDrafter(tiny_draft, context_window=4) if tree is None
               else DraftModelDrafter(tiny_draft, context_window=4, tree=tree))
    decoder = SpeculativeDecoder(tiny_target, drafter, num_speculative_tokens=2, policy=FixedK(2))
    out = decoder.generate(prompt, SamplingParams(max_new_tokens=24))
    assert out.token_ids == plain_greedy(tiny_target, prompt, 24)
    assert drafter._runner.positions < decoder._runner.positions and out.stats.draft_forwards > 1
    drafter.begin(prompt)
    assert drafter._runner.positions == 0  # the window is read when the draft first drafts
    drafter.propose(prompt, 1, SamplingParams(), None, new_processor(decoder.target, prompt, SamplingParams()))
    # the window's 4 tokens, not the prompt's 10
    assert drafter._runner.positions == 4 and drafter._runner.cached_ids == prompt[-4:]


# ---- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -2])
def test_k_below_one_is_refused(tiny_target, k):
    with pytest.raises(InvalidParameterError, match="K"):
        SpeculativeDecoder(tiny_target, "ngram", num_speculative_tokens=k)


def test_a_prompt_longer_than_the_context_is_refused(tiny_target):
    decoder = SpeculativeDecoder(tiny_target, "ngram")
    with pytest.raises(ContextLengthError, match="shorten the prompt"):
        decoder.generate([1] * 200)
    with pytest.raises(ContextLengthError, match="at most 28 new tokens"):
        decoder.generate([1] * 100, SamplingParams(max_new_tokens=64))


def test_bad_prompts_are_refused(tiny_target):
    decoder = SpeculativeDecoder(tiny_target)
    with pytest.raises(InvalidParameterError, match="no tokenizer"):
        decoder.generate("text needs a tokenizer")
    with pytest.raises(InvalidParameterError, match="empty"):
        decoder.generate([])
    with pytest.raises(InvalidParameterError, match=r"\[0, 8\)"):
        decoder.generate([1, 99])


def test_an_unknown_draft_is_refused(tiny_target):
    with pytest.raises(InvalidParameterError, match="draft must be"):
        SpeculativeDecoder(tiny_target, "mystery")


def test_a_draft_with_another_vocabulary_is_refused(tiny_target):
    from quickdraft import TokenizerMismatchError

    with pytest.raises(TokenizerMismatchError):
        SpeculativeDecoder(tiny_target, make_tiny_model(seed=3, vocab_size=9))


def test_a_model_whose_cache_cannot_be_rolled_back_is_refused(tiny_target, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.DynamicCache, "is_croppable", property(lambda self: False))
    with pytest.raises(UnsupportedModelError, match="rolled back"):
        ModelRunner(tiny_target)


def test_sliding_window_models_roll_back_correctly():
    # A window of 4 is far shorter than the 30 tokens generated: rollbacks must restore
    # states the window had already dropped.
    from transformers import MistralConfig, MistralForCausalLM

    from quickdraft.models.base import LoadedModel

    config = MistralConfig(
        vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
        max_position_embeddings=128, initializer_range=0.6,
    )
    torch.manual_seed(0)
    target = LoadedModel(MistralForCausalLM(config).eval(), None, "window-target")
    torch.manual_seed(1)
    draft = LoadedModel(MistralForCausalLM(config).eval(), None, "window-draft")
    expected = plain_greedy(target, [1, 2, 3], 30)
    for drafter in (draft, "ngram"):
        out = SpeculativeDecoder(target, drafter, num_speculative_tokens=3, policy=FixedK(3)).generate(
            [1, 2, 3], SamplingParams(max_new_tokens=30)
        )
        assert out.token_ids == expected


def test_restricted_vocabulary_logits_equal_the_full_logits_on_their_rows(tiny_draft):
    full = ModelRunner(tiny_draft)
    restricted = ModelRunner(tiny_draft)
    rows = torch.tensor([0, 2, 5])
    restricted.restrict_vocabulary(rows)
    a = full.forward([1, 2, 3], num_logits=2)
    b = restricted.forward([1, 2, 3], num_logits=2)
    # Packed rows compute in bfloat16 (8 significant bits), float32 rows in float32.
    tolerance = dict(rtol=2e-2, atol=2e-2) if restricted._rows.packed else dict(atol=1e-5)
    assert torch.allclose(a[:, rows], b[:, rows], **tolerance)
    others = torch.tensor([1, 3, 4, 6, 7])
    assert torch.isinf(b[:, others]).all()


def test_greedy_with_a_restricted_vocabulary_draft_equals_plain_greedy(tiny_target, tiny_draft):
    from quickdraft.drafters import DraftModelDrafter

    drafter = DraftModelDrafter(tiny_draft, vocabulary_size=3)
    for prompt in PROMPTS:
        out = SpeculativeDecoder(tiny_target, drafter, num_speculative_tokens=3, policy=FixedK(3)).generate(
            prompt, SamplingParams(max_new_tokens=20)
        )
        assert out.token_ids == plain_greedy(tiny_target, prompt, 20)


def test_seeded_sampling_is_reproducible_with_the_adaptive_policy(tiny_target, tiny_draft):
    # AdaptiveK decides k from timings and history; a seeded sampled run must not depend on it.
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=11)
    first = decoder.generate([1, 2], params).token_ids
    for _ in range(3):
        decoder.generate([5, 6, 7], SamplingParams(temperature=0.5, max_new_tokens=10))  # moves the estimates
        assert decoder.generate([1, 2], params).token_ids == first


# ---- a draft model reads the prompt when it first drafts ----------------------------------------

LONG_PROMPT = [(5 * i) % 7 + 1 for i in range(30)]


class CatchUpRecorder(FixedK):
    """FixedK that records the catch-up it is told of at each step and each one it is shown."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.offered: list[int] = []
        self.caught_up: list[int] = []

    def choose(self, max_k, lookup_tokens=0, catch_up=0, remaining=None):
        self.offered.append(catch_up)
        return super().choose(max_k, lookup_tokens, catch_up, remaining)

    def observe_catch_up(self, positions, seconds) -> None:
        self.caught_up.append(positions)


def test_a_draft_model_reads_a_long_prompt_in_a_catch_up_of_its_own(tiny_draft):
    from quickdraft.drafters.draft_model import READ_WITH_STEP, DraftModelDrafter

    drafter = DraftModelDrafter(tiny_draft)
    drafter.begin(LONG_PROMPT)
    assert drafter.forwards == 0  # nothing read before it drafts
    assert drafter.behind(LONG_PROMPT) == len(LONG_PROMPT) - 1
    drafter.catch_up(LONG_PROMPT)
    assert (drafter.forwards, drafter.positions) == (1, len(LONG_PROMPT) - 1)
    assert drafter.behind(LONG_PROMPT) == 0
    short = LONG_PROMPT[: READ_WITH_STEP + 1]  # read with the first step's forward
    drafter.begin(short)
    assert drafter.behind(short) == 0


def test_the_draft_model_catches_up_once_and_the_output_stays_the_targets(tiny_target, tiny_draft):
    policy = CatchUpRecorder(3)
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3, policy=policy,
                                 prompt_lookup=False)
    out = decoder.generate(LONG_PROMPT, SamplingParams(max_new_tokens=24))
    assert out.token_ids == plain_greedy(tiny_target, LONG_PROMPT, 24)
    assert policy.offered[0] == len(LONG_PROMPT) - 1 and not any(policy.offered[1:])
    assert policy.caught_up == [len(LONG_PROMPT) - 1]


def test_where_the_policy_never_drafts_the_draft_model_never_reads_the_prompt(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, policy=FixedK(0))
    out = decoder.generate(LONG_PROMPT, SamplingParams(max_new_tokens=16))
    assert out.token_ids == plain_greedy(tiny_target, LONG_PROMPT, 16)
    assert out.stats.draft_forwards == 0 and out.stats.draft_positions == 0


def test_a_draft_model_behind_after_plain_steps_catches_up_before_it_drafts_again(tiny_target, tiny_draft):
    class DraftsEveryTenthStep(CatchUpRecorder):
        def choose(self, max_k, lookup_tokens=0, catch_up=0, remaining=None):
            self.offered.append(catch_up)
            return Choice(MODEL, min(2, max_k) if len(self.offered) % 10 == 1 else 0)

    policy = DraftsEveryTenthStep(2)
    prompt = LONG_PROMPT[:4]
    out = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=2, policy=policy,
                             prompt_lookup=False).generate(prompt, SamplingParams(max_new_tokens=30))
    assert out.token_ids == plain_greedy(tiny_target, prompt, 30)
    # nine plain steps leave the draft at least 9 tokens behind: read in a forward of its own
    assert policy.caught_up and all(n > 8 for n in policy.caught_up)

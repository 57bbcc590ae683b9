"""Penalties, min-p, logit bias, logprobs, n, stop token ids: their semantics, and that
speculation keeps plain decoding's output distribution under every one of them.

Semantics: hand-built cases re-derived from transformers' and vLLM's own tests, and agreement
with transformers' processors. Losslessness: whole continuations of tiny random models against
their exact distribution by enumeration (``enumeration.py``), with a draft model, with prompt
lookup (one-hot q), chains and trees; the control (a penalty that forgets the drafted tokens
before each verified position) must fail.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

import quickdraft.processing as processing
from enumeration import exact_outcomes, outcome_p_value, reference_logprob, sampled_outcomes
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder, TreeSpec
from quickdraft.errors import InvalidParameterError
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import logits_to_probs

PROMPT = [3, 1, 3]
LENGTH = 3
RUNS = 2000
# Strong options, so that a processor that gets a row's prefix wrong moves the distribution a lot.
OPTIONS = dict(repetition_penalty=1.8, frequency_penalty=1.5, presence_penalty=0.7,
               logit_bias={0: 1.5, 5: -2.0}, min_p=0.05)


def _params(**extra):
    return lambda seed: SamplingParams(temperature=1.0, max_new_tokens=LENGTH, seed=seed, **{**OPTIONS, **extra})  # noqa: E731


# ---- semantics ---------------------------------------------------------------------------


def test_repetition_penalty_as_transformers_test_defines_it():
    # transformers' test_repetition_penalty_dist_process: tokens 0 and 1 seen, penalty 2.
    vocab = 10
    logits = torch.full((1, vocab), 1.0 / vocab)
    logits[0, 0] = -1.0 / vocab
    processor = LogitsProcessor(SamplingParams(repetition_penalty=2.0), vocab, prompt_ids=[0, 1])
    out = processor(logits)[0]
    assert out[0] == pytest.approx(-(1.0 / vocab) * 2)  # negative: multiplied
    assert out[1] == pytest.approx((1.0 / vocab) / 2)  # positive: divided
    assert torch.equal(out[2:], logits[0, 2:])  # unseen: unchanged


def test_repetition_penalty_counts_prompt_and_output_like_transformers():
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 3
    prompt, output = [1, 4], [4, 7, 9]
    processor = LogitsProcessor(SamplingParams(repetition_penalty=1.7), 12, prompt)
    processor.commit(output)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + output]), logits.clone())
    assert torch.allclose(processor(logits), expected)


def test_frequency_and_presence_penalties_count_the_output_only():
    # OpenAI: logit - count * frequency - (count > 0) * presence; vLLM counts output tokens only.
    logits = torch.zeros(1, 6)
    processor = LogitsProcessor(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), 6, prompt_ids=[5])
    processor.commit([2, 3, 2])
    assert processor(logits)[0].tolist() == [0.0, 0.0, -1.25, -0.75, 0.0, 0.0]


def test_logit_bias_is_added_and_minus_100_bans():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=1.0, logit_bias={"1": 3.0, 0: -100})  # OpenAI sends string keys
    out = LogitsProcessor(params, 4, prompt_ids=[0])(logits)
    assert out[0].tolist() == [-98.0, 4.0, 0.0, -1.0]
    assert logits_to_probs(out, params)[0, 0] < 1e-40


def test_min_p_keeps_tokens_at_least_min_p_times_the_top_one():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    got = logits_to_probs(probs.log(), SamplingParams(temperature=1.0, min_p=0.2))  # floor 0.1
    assert torch.allclose(got, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_matches_transformers(min_p):
    torch.manual_seed(1)
    logits = torch.randn(4, 50) * 2
    expected = torch.softmax(MinPLogitsWarper(min_p)(None, logits.clone()), dim=-1)
    got = logits_to_probs(logits, SamplingParams(temperature=1.0, min_p=min_p))
    assert torch.allclose(got, expected, atol=1e-6) and torch.equal(got > 0, expected > 0)


def test_each_row_counts_the_drafted_tokens_before_it_as_plain_decoding_would():
    # The vectorised rows of one verification equal a processor that committed each prefix.
    torch.manual_seed(2)
    vocab, prompt, drafts = 9, [1, 2], [4, 4, 6]
    params = SamplingParams(temperature=1.0, **OPTIONS)
    logits = torch.randn(len(drafts) + 1, vocab) * 2  # [K + 1, V]
    rows = LogitsProcessor(params, vocab, prompt)(logits, drafts)
    for i in range(len(drafts) + 1):
        plain = LogitsProcessor(params, vocab, prompt)
        plain.commit(drafts[:i])
        assert torch.allclose(rows[i], plain(logits[i : i + 1])[0])
    # A tree: row i + 1 follows node i's path (nodes 0 -> 1 -> 3 and 0 -> 2).
    tokens, parents = [4, 6, 4, 4], [-1, 0, 0, 1]
    tree_logits = torch.randn(len(tokens) + 1, vocab) * 2  # [N + 1, V]
    tree_rows = LogitsProcessor(params, vocab, prompt)(tree_logits, tokens, parents)
    for row, path in enumerate([[], [4], [4, 6], [4, 4], [4, 6, 4]]):
        plain = LogitsProcessor(params, vocab, prompt)
        plain.commit(path)
        assert torch.allclose(tree_rows[row], plain(tree_logits[row : row + 1])[0])


@pytest.mark.parametrize("kwargs,match", [
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {1: 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "needs logprobs"),
    ({"n": 0}, "n must"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"regex": "a+", "grammar": "start: /a/"}, "at most one"),
    ({"regex": "a+", "ignore_eos": True}, "ignore_eos"),
    ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 1.5}, "num_speculative_tokens"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        SamplingParams(**kwargs)


def test_token_ids_outside_the_vocabulary_are_refused_before_any_work(tiny_target):
    decoder = SpeculativeDecoder(tiny_target)
    for params in (SamplingParams(logit_bias={8: 1.0}, max_new_tokens=4), SamplingParams(stop_token_ids=(99,), max_new_tokens=4)):
        with pytest.raises(InvalidParameterError, match=r"not in \[0, 8\)"):
            decoder.stream([1], params)
    with pytest.raises(InvalidParameterError, match="tokenizer"):
        decoder.stream([1], SamplingParams(regex="a", max_new_tokens=4))


# ---- losslessness ------------------------------------------------------------------------


@pytest.mark.slow
def test_options_keep_the_target_with_a_draft_model_and_prompt_lookup(tiny_target, tiny_draft):
    params = _params()
    exact = exact_outcomes(tiny_target, PROMPT, params(0))
    # The prompt ends in 3, seen before followed by 1: prompt lookup drafts (one-hot q) in
    # many steps, the draft model (its q processed the same way) in the others.
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=2, policy=FixedK(2), prompt_lookup=True)
    counts = sampled_outcomes(decoder, PROMPT, params, RUNS)
    assert outcome_p_value(counts, exact) > 1e-3


@pytest.mark.parametrize("spec", [TreeSpec(widths=(2, 2), sample_children=True), TreeSpec(budget=5, depth=2, branch=2)],
                         ids=["sampled-static", "dynamic"])
def test_options_keep_the_target_with_trees(tiny_target, tiny_draft, spec):
    params = _params(top_k=6)
    exact = exact_outcomes(tiny_target, PROMPT, params(0))
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, tree=spec, policy=FixedK(2))
    counts = sampled_outcomes(decoder, PROMPT, params, RUNS // 2)
    assert outcome_p_value(counts, exact) > 1e-3


def test_options_keep_the_target_with_prompt_lookup_trees(tiny_target):
    params = _params(top_p=0.9)
    exact = exact_outcomes(tiny_target, PROMPT, params(0))
    decoder = SpeculativeDecoder(tiny_target, "ngram", tree=TreeSpec(widths=(2, 1)), policy=FixedK(2))
    counts = sampled_outcomes(decoder, PROMPT, params, RUNS // 2)
    assert outcome_p_value(counts, exact) > 1e-3


def test_the_test_catches_penalties_that_forget_the_drafted_tokens(tiny_target, tiny_draft, monkeypatch):
    # The bug vLLM avoided by switching penalties off under speculation: every verified row
    # penalised as if the drafts before it had not been emitted.
    monkeypatch.setattr(processing, "node_paths", lambda parents, rows: [[] for _ in rows])
    params = _params()
    exact = exact_outcomes(tiny_target, PROMPT, params(0))
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=2, policy=FixedK(2), prompt_lookup=True)
    counts = sampled_outcomes(decoder, PROMPT, params, RUNS // 4)
    assert outcome_p_value(counts, exact) < 1e-6


DRAFTERS = {
    "draft-model": lambda draft: dict(draft=draft, prompt_lookup=True),
    "ngram": lambda draft: dict(draft="ngram"),
    "tree": lambda draft: dict(draft=draft, tree=TreeSpec(widths=(2, 2))),
    "ngram-tree": lambda draft: dict(draft="ngram", tree=TreeSpec(widths=(2, 1))),
}


def _plain_and_speculative(tiny_target, tiny_draft, kind):
    return SpeculativeDecoder(tiny_target), SpeculativeDecoder(tiny_target, policy=FixedK(3), **DRAFTERS[kind](tiny_draft))


@pytest.mark.parametrize("kind", DRAFTERS)
def test_greedy_with_options_equals_plain_greedy_and_the_naive_reference(tiny_target, tiny_draft, kind):
    plain, speculative = _plain_and_speculative(tiny_target, tiny_draft, kind)
    params = SamplingParams(max_new_tokens=16, logprobs=True, top_logprobs=3,
                            **{**OPTIONS, "frequency_penalty": 0.4, "presence_penalty": 0.2})
    expected = plain.generate(PROMPT, params)
    got = speculative.generate(PROMPT, params)
    assert got.token_ids == expected.token_ids
    assert got.stats.accepted_tokens > 0
    for mine, theirs in zip(got.logprobs, expected.logprobs):
        assert mine.token_id == theirs.token_id and abs(mine.logprob - theirs.logprob) < 1e-5
        assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]
    # plain decoding itself is the naive reference: argmax of one processed row per prefix
    for i, token in enumerate(expected.token_ids):
        assert token == int(reference_logprob(tiny_target, PROMPT, expected.token_ids[:i], params).argmax())


@pytest.mark.parametrize("kind", DRAFTERS)
def test_sampled_logprobs_are_plain_decodings(tiny_target, tiny_draft, kind):
    _, speculative = _plain_and_speculative(tiny_target, tiny_draft, kind)
    params = SamplingParams(temperature=0.8, top_k=6, max_new_tokens=12, seed=3, logprobs=True, top_logprobs=2, **OPTIONS)
    out = speculative.generate(PROMPT, params)
    assert out.stats.accepted_tokens > 0 and len(out.logprobs) == len(out.token_ids)
    for i, entry in enumerate(out.logprobs):
        expected = reference_logprob(tiny_target, PROMPT, out.token_ids[:i], params)  # [V]
        assert entry.token_id == out.token_ids[i]
        assert abs(entry.logprob - float(expected[entry.token_id])) < 1e-5
        top = torch.topk(expected, 2)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert torch.allclose(torch.tensor([v for _, v in entry.top]), top.values, atol=1e-5)


def test_n_samples_are_independent_draws_sharing_the_prefill(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=2, policy=FixedK(2))
    # the joint distribution of two one-token samples is the product of the target's
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=1, n=2, seed=seed)  # noqa: E731
    p = logits_to_probs(tiny_target.module(input_ids=torch.tensor([PROMPT])).logits[0, -1].detach(), params(0))
    exact = {(a, b): float(p[a] * p[b]) for a in range(8) for b in range(8)}
    from collections import Counter
    counts = Counter(tuple(o.token_ids[0] for o in decoder.generate_choices(PROMPT, params(seed))) for seed in range(600))
    assert outcome_p_value(counts, exact) > 1e-3
    # the second sample does not prefill the prompt again
    long_prompt = list(range(8)) * 5
    outs = decoder.generate_choices(long_prompt, SamplingParams(temperature=1.0, max_new_tokens=4, n=2, seed=0))
    assert outs[0].stats.target_positions >= len(long_prompt) > outs[1].stats.target_positions
    with pytest.raises(InvalidParameterError, match="generate_choices"):
        decoder.generate(PROMPT, params(0))


def test_stop_token_ids_end_the_output_like_an_end_of_sequence_token(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, num_speculative_tokens=3, policy=FixedK(3))
    free = decoder.generate(PROMPT, SamplingParams(max_new_tokens=12))
    stop = free.token_ids[4]
    out = decoder.generate(PROMPT, SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)))
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert out.finish_reason == "stop"

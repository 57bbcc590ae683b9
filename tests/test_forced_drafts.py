"""Grammar-forced drafts (``quickdraft.drafters.forced``): the tokens a constraint forces are
what it allows, both engines draft them first (a drafter continuing after them), and the
output stays the constrained target's exactly, greedy and sampled."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from conftest import json_model
from enumeration import exact_outcomes, outcome_p_value, sampled_outcomes
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder
from quickdraft.batch import BatchEngine
from quickdraft.drafters.base import Draft
from quickdraft.drafters.forced import after_forced
from quickdraft.processing import LogitsProcessor

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
# Three forced characters, two free choices, then the end.
REGEX = "ab,(a|b)(a|b)"
RUNS = 1200


@pytest.fixture(scope="module")
def target():
    return json_model(11)


@pytest.fixture(scope="module")
def draft():
    return json_model(12)


def _ids(model, text: str) -> list[int]:
    return [model.tokenizer.convert_tokens_to_ids(c) for c in text]


def _processor(model, params: SamplingParams, prompt=(2,)) -> LogitsProcessor:
    return LogitsProcessor(params, model.vocab_size, list(prompt), model.tokenizer, [model.tokenizer.eos_token_id])


def test_the_forced_tokens_are_the_keys_the_schema_fixes(target):
    processor = _processor(target, SamplingParams(response_format=JSON_SCHEMA))
    assert processor.forced_tokens(16) == _ids(target, '{"a":')
    assert processor.forced_tokens(3) == _ids(target, '{"a')
    # After a drafted path: the value is free, and after its comma the next key is forced.
    assert processor.forced_tokens(16, _ids(target, '{"a":7')) == []
    assert processor.forced_tokens(16, _ids(target, '{"a":7,')) == _ids(target, '"b":')
    # Nothing is forced after a path the schema forbids.
    assert processor.forced_tokens(16, _ids(target, '{"c')) == []
    # Asking consumed nothing: the committed state still allows only "{".
    allowed = (processor(torch.zeros(1, target.vocab_size)) > float("-inf")).nonzero()[:, 1].tolist()
    assert allowed == _ids(target, "{")
    processor.commit(_ids(target, '{"a":42,"b":true'))
    assert processor.forced_tokens(16) == _ids(target, "}")  # the end token is never drafted
    processor.commit(_ids(target, "}"))
    assert processor.forced_tokens(16) == []
    assert _processor(target, SamplingParams()).forced_tokens(16) == []  # no constraint


def test_a_drafter_after_forced_tokens_is_processed_as_after_them(target):
    params = SamplingParams(regex=REGEX, presence_penalty=0.7)
    processor = _processor(target, params)
    forced, drafted = _ids(target, "ab"), _ids(target, ",a")
    logits = torch.randn(3, target.vocab_size)
    expected = processor(logits, forced + drafted, rows=[1, 2, 3])
    assert torch.equal(processor.after(forced)(logits, drafted), expected)
    tree = processor.after(forced)(logits, drafted, parents=[-1, 0], rows=[-1, 0, 1])
    assert torch.equal(tree, expected)
    assert processor.after([]) is processor


def test_forced_tokens_go_in_front_of_a_draft_with_one_hot_q():
    q = torch.softmax(torch.randn(2, 5), dim=-1)
    draft = after_forced([3, 4], Draft(tokens=torch.tensor([1, 2]), probs=q, parents=torch.tensor([-1, -1])))
    assert draft.tokens.tolist() == [3, 4, 1, 2]
    assert draft.parents.tolist() == [-1, 0, 1, 1]
    assert torch.equal(draft.probs[:2], torch.eye(5)[[3, 4]]) and torch.equal(draft.probs[2:], q)
    assert after_forced([3], Draft(tokens=torch.tensor([1]))).probs is None


DECODERS = {
    "draft-model": lambda draft: dict(draft=draft, prompt_lookup=False),
    "lookup-first": lambda draft: dict(draft=draft, prompt_lookup=True),
    "ngram": lambda draft: dict(draft="ngram"),
}


@pytest.mark.parametrize("kind", DECODERS)
def test_greedy_structured_output_with_forced_drafts_is_plain_greedy(target, draft, kind):
    prompt = target.tokenizer('{"a":1,"b":true}')["input_ids"]
    params = SamplingParams(max_new_tokens=40, response_format=JSON_SCHEMA)
    expected = SpeculativeDecoder(target).generate(prompt, params)
    out = SpeculativeDecoder(target, policy=FixedK(4), **DECODERS[kind](draft)).generate(prompt, params)
    assert out.token_ids == expected.token_ids
    assert json.loads(out.text) == json.loads(expected.text)
    # Most of '{"a":', ',"b":' and '}' come from the grammar (the target's own token each step
    # may take one of them), and are accepted.
    assert out.stats.grammar_accepted_tokens >= 6, out.stats
    assert out.stats.grammar_tokens <= out.stats.drafted_tokens


@pytest.mark.parametrize("kind", ["draft-model", "ngram"])
def test_every_concurrent_row_with_forced_drafts_is_plain_greedy(target, draft, kind):
    texts = ['{"a":1,"b":true}', '{"a":22,"b":false}', "a,b", '{"b":true}', "12", '{"a":', "0", "tr"]
    prompts = [target.tokenizer(text)["input_ids"] for text in texts]
    params = SamplingParams(max_new_tokens=30, response_format=JSON_SCHEMA)
    plain = SpeculativeDecoder(target)
    expected = [plain.generate(prompt, params).token_ids for prompt in prompts]
    engine = BatchEngine(target, draft if kind == "draft-model" else "ngram", num_speculative_tokens=4,
                         policy=FixedK(4))
    outs = engine.generate_batch(prompts, params)
    assert [out.token_ids for out in outs] == expected
    assert all(out.stats.grammar_accepted_tokens >= 6 for out in outs), [out.stats for out in outs]


def test_the_policy_drafts_forced_tokens_where_they_pay(target, draft):
    # The adaptive policies' own choice (no fixed k): the forced tokens are still drafted.
    prompt = target.tokenizer('{"a":1,"b":true}')["input_ids"]
    params = SamplingParams(max_new_tokens=40, response_format=JSON_SCHEMA)
    out = SpeculativeDecoder(target, draft).generate(prompt, params)
    assert out.token_ids == SpeculativeDecoder(target).generate(prompt, params).token_ids
    assert out.stats.grammar_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", DECODERS)
def test_a_sampled_output_with_forced_drafts_is_the_constrained_targets(target, draft, kind):
    prompt = target.tokenizer("ab,ba")["input_ids"]
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=6, seed=seed, regex=REGEX,  # noqa: E731
                                         presence_penalty=0.8)
    exact = exact_outcomes(target, prompt, params(0))
    assert len(exact) == 4  # "ab,", a or b twice, the end token
    decoder = SpeculativeDecoder(target, policy=FixedK(4), **DECODERS[kind](draft))
    counts = sampled_outcomes(decoder, prompt, params, RUNS)
    assert outcome_p_value(counts, exact) > 1e-3
    # The forced "ab," was drafted first, and accepted.
    out = decoder.generate(prompt, params(0))
    assert out.stats.grammar_tokens == out.stats.grammar_accepted_tokens == 3


@pytest.mark.slow
def test_a_sampled_batch_with_forced_drafts_is_the_constrained_targets(target, draft):
    prompt = target.tokenizer("ab,ba")["input_ids"]
    exact = exact_outcomes(target, prompt, SamplingParams(temperature=1.0, max_new_tokens=6, regex=REGEX))
    # No prompt lookup: the draft model drafts after the forced tokens.
    engine = BatchEngine(target, draft, num_speculative_tokens=4, policy=FixedK(4), prompt_lookup=False)
    counts: Counter = Counter()
    rows = 8
    for start in range(0, RUNS, rows):
        params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=seed, regex=REGEX)
                  for seed in range(start, start + rows)]
        counts.update(tuple(out.token_ids) for out in engine.generate_batch([prompt] * rows, params))
    assert outcome_p_value(counts, exact) > 1e-3

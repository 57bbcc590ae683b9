"""The drafter registry: specs to drafters, defaults, and a new kind in one registry line."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from helpers import plain_greedy
from quickdraft import FixedK, InvalidParameterError, SamplingParams, SpeculativeDecoder
from quickdraft.drafters import (
    KINDS,
    Draft,
    DrafterBase,
    DraftModelDrafter,
    PromptLookupDrafter,
    PromptLookupFirst,
    make_drafter,
)
from quickdraft.drafters.registry import Kind, default_draft, names_a_kind
from quickdraft.memory import kv_bytes_per_token, weight_bytes


class RepeatDrafter(DrafterBase):
    """docs/drafters.md's example: the sequence's last token, k times."""

    name = "repeat"

    def propose(self, sequence: Sequence[int], k, params, generator, processor) -> Draft:
        return Draft(tokens=torch.full((k,), sequence[-1], dtype=torch.long))


def test_a_new_kind_is_one_registry_line(tiny_target, monkeypatch):
    monkeypatch.setitem(KINDS, "repeat", Kind(lambda argument, target, tree: RepeatDrafter(), lookup_first=False))
    assert names_a_kind("repeat") and not names_a_kind("some-model")
    decoder = SpeculativeDecoder(tiny_target, "repeat", num_speculative_tokens=3, policy=FixedK(3))
    out = decoder.generate([1, 2, 2], SamplingParams(max_new_tokens=16))
    assert out.token_ids == plain_greedy(tiny_target, [1, 2, 2], 16)
    assert out.stats.drafted_tokens > 0


def test_specs_and_their_defaults(tiny_target, tiny_draft):
    assert make_drafter(None, tiny_target) is None and make_drafter("none", tiny_target) is None
    assert isinstance(make_drafter("ngram", tiny_target), PromptLookupDrafter)
    wrapped = make_drafter(tiny_draft, tiny_target)  # prompt lookup in front of a model by default
    assert isinstance(wrapped, PromptLookupFirst) and isinstance(wrapped.inner, DraftModelDrafter)
    assert isinstance(make_drafter(tiny_draft, tiny_target, prompt_lookup=False), DraftModelDrafter)
    custom = RepeatDrafter()
    assert make_drafter(custom, tiny_target) is custom
    assert make_drafter(custom, tiny_target, prompt_lookup=True).inner is custom
    with pytest.raises(InvalidParameterError, match="nothing for it to stand in front of"):
        make_drafter("ngram", tiny_target, prompt_lookup=True)
    with pytest.raises(InvalidParameterError, match="draft must be"):
        make_drafter("mystery:x", tiny_target)


def test_the_footprint_is_what_the_server_counts(tiny_target, tiny_draft):
    footprint = make_drafter(tiny_draft, tiny_target).footprint()
    assert footprint.weight_bytes == weight_bytes(tiny_draft)
    assert footprint.cache_bytes_per_token == kv_bytes_per_token(tiny_draft)
    assert footprint.context_length == tiny_draft.context_length
    assert make_drafter("ngram", tiny_target).footprint().weight_bytes == 0


def test_the_default_draft_follows_the_target():
    draft, note = default_draft("qwen2.5-coder-1.5b-instruct")
    assert draft == "qwen2.5-coder-0.5b-instruct" and "sibling" in note and "\n" not in note
    assert default_draft("/models/Qwen2.5-Coder-1.5B-Instruct/")[0] == "qwen2.5-coder-0.5b-instruct"
    draft, note = default_draft("smollm2-135m-instruct")
    assert draft == "ngram" and "no smaller sibling of smollm2-135m-instruct" in note and "\n" not in note

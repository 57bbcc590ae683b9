"""logits -> probabilities: hand-computed cases and agreement with transformers' own warpers."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError
from quickdraft.sampling import greedy, logits_to_probs, sample


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=-1))


def test_top_k_keeps_k_most_likely():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 2.5])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, False, False, True]
    assert torch.allclose(probs[[1, 4]], torch.softmax(torch.tensor([3.0, 2.5]), dim=-1))


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    # probabilities 0.5, 0.3, 0.2: top_p = 0.6 needs the first two (0.5 < 0.6 <= 0.8).
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert torch.allclose(probs, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0]))
    # exactly on a boundary: 0.5 reaches top_p = 0.5, so only the first survives.
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0]


def test_top_p_tiny_keeps_argmax():
    probs = logits_to_probs(torch.tensor([1.0, 5.0, 2.0]), SamplingParams(temperature=1.0, top_p=1e-9))
    assert probs.tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.5, 7, 0.9)])
def test_matches_transformers_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3  # [B, V]
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    expected = torch.softmax(expected, dim=-1)
    got = logits_to_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.equal(got > 0, expected > 0)


def test_bfloat16_logits_give_float32_probs_and_nan_is_never_chosen():
    logits = torch.tensor([1.0, float("nan"), float("-inf"), 2.0], dtype=torch.bfloat16)
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0))
    assert probs.dtype == torch.float32
    assert probs[1] == 0 and probs[2] == 0
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    assert greedy(logits).item() == 3


def test_sample_is_reproducible_with_a_seeded_generator():
    probs = torch.softmax(torch.randn(10, 30), dim=-1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert a.shape == (10,) and torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_impossible_parameters_are_refused(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        SamplingParams(**kwargs)


def test_a_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)


def test_top_p_mass_landing_exactly_on_top_p_keeps_no_extra_token():
    # transformers' test_top_p_dist_warper: .5 + .3 reaches top_p = 0.8 exactly, so the two
    # tokens of .1 go. ``cumsum - probs`` rounded 0.8 down to 0.79999995 and kept one of them.
    logits = torch.tensor([0.3, 0.1, 0.1, 0.5]).log()
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.375, 0.0, 0.0, 0.625]))

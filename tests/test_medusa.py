"""Medusa heads: training, drafting, losslessness, checkpoints, the benchmark and the server."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import chi_square_p_value
from quickdraft import (CheckpointMismatchError, FixedK, InvalidParameterError, ModelNotFoundError, SamplingParams,
                        SpeculativeDecoder, TreeSpec)
from quickdraft.drafters import MedusaHeads
from quickdraft.drafters.head_checkpoint import save_head
from quickdraft.training import train_drafter
from quickdraft.training.trainer import _medusa_loss
from helpers import (CONFIG, LENGTH, PROMPT, assert_greedy_output_is_the_target_s, greedy_acceptance, quiet,
                     random_documents, sample_counts, target_samples)
from conftest import exact_continuation_probs

HEADS = 3
MEDUSA = dataclasses.replace(CONFIG, kind="medusa", heads=HEADS)


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory):
    """(folder, training record) of Medusa heads trained for ``tiny_target``."""
    folder = tmp_path_factory.mktemp("medusa")
    record = train_drafter(tiny_target, [target_samples(tiny_target, seed=0)], folder, MEDUSA, progress=False,
                           log=quiet)
    return folder, record


@pytest.fixture(scope="module")
def random_heads(tiny_target, tmp_path_factory):
    """Medusa heads with random blocks (an untrained head is the identity: see the next test)."""
    folder = tmp_path_factory.mktemp("medusa-random")
    torch.manual_seed(0)
    heads = MedusaHeads(tiny_target.module.config.hidden_size, HEADS)
    for block in heads.blocks:
        torch.nn.init.normal_(block.weight, std=0.5)
        torch.nn.init.normal_(block.bias, std=0.5)
    save_head(heads, tiny_target, folder, {})
    return folder


def test_an_untrained_head_guesses_the_target_s_next_token_again(tiny_target):
    heads = MedusaHeads(tiny_target.module.config.hidden_size, HEADS)
    features = torch.randn(5, tiny_target.module.config.hidden_size)
    assert torch.equal(heads(features), features[:, None].expand(5, HEADS, -1))


def test_the_loss_scores_head_j_against_the_target_j_tokens_later(tiny_target):
    """Hand-built: features that are one-hot rows of the output layer's identity, so the target's
    top token at position i is i's own; head j must guess position i + j's."""
    hidden = 4
    heads = MedusaHeads(hidden, 2)
    for j, block in enumerate(heads.blocks, start=1):  # head j maps e_i to e_{i+j} (times 100)
        with torch.no_grad():
            block.weight.copy_(100 * torch.roll(torch.eye(hidden), j, dims=0))
    features = torch.eye(hidden)[[0, 1, 2, 3, 0, 1]][None]  # [1, 6, 4]: token "i" at position i
    _, _, first, later = _medusa_loss(heads, torch.eye(hidden), features, torch.tensor([0, 1, 2, 3]))
    assert first.item() == 1.0 and later.item() == 1.0
    _, _, first, _ = _medusa_loss(MedusaHeads(hidden, 2), torch.eye(hidden), features, torch.tensor([0, 1, 2, 3]))
    assert first.item() == 0.0  # identity heads guess the token one place ahead, not two


def test_training_lowers_the_loss_and_raises_acceptance(tiny_target, trained, random_heads):
    history = trained[1]["history"]
    # The heads start as the identity, already 0.58 right on this repetitive text: smaller gains than EAGLE's.
    assert history[-1]["loss"] < 0.9 * history[0]["loss"]
    assert history[-1]["top1_agreement"] > history[0]["top1_agreement"] + 0.02
    assert history[-1]["later_top1_agreement"] > history[0]["later_top1_agreement"] + 0.02
    prompts = random_documents(1, count=6, length=5)
    medusa = lambda folder: greedy_acceptance(tiny_target, folder, prompts, "medusa")  # noqa: E731
    assert medusa(trained[0]) > medusa(random_heads) + 0.2  # about 0.39 against 0.11


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_is_the_target_s(tiny_target, trained, k):
    stats = assert_greedy_output_is_the_target_s(tiny_target, f"medusa:{trained[0]}", k)
    assert stats.drafted_tokens <= min(k, HEADS) * stats.steps  # no more tokens than heads


@pytest.mark.slow
def test_sampling_with_medusa_heads_keeps_the_target_distribution(tiny_target, trained):
    params = lambda seed: SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, f"medusa:{trained[0]}", num_speculative_tokens=2, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3


def test_another_target_a_head_of_the_other_kind_or_a_tree_is_refused(tiny_target, tiny_draft, trained):
    with pytest.raises(CheckpointMismatchError, match="train-drafter --target tiny-draft --kind medusa"):
        SpeculativeDecoder(tiny_draft, f"medusa:{trained[0]}")
    with pytest.raises(ModelNotFoundError, match="kind 'medusa', not 'eagle': use it as --draft medusa:"):
        SpeculativeDecoder(tiny_target, f"eagle:{trained[0]}")
    with pytest.raises(InvalidParameterError, match="chains only"):
        SpeculativeDecoder(tiny_target, f"medusa:{trained[0]}", tree=TreeSpec(budget=4, depth=2))


def test_the_benchmark_and_the_server_know_medusa_heads(tiny_target, trained):
    from quickdraft.bench.methods import build_methods
    from quickdraft.server.app import ServerConfig, cache_bytes_per_token, memory_report

    plain, *medusa = build_methods(tiny_target, None, ["plain", "medusa", "medusa-adaptive"], peer=False,
                                   medusa=str(trained[0]))
    params = SamplingParams(max_new_tokens=12)
    reference = plain.generate([3, 1, 4], params, k=3).token_ids
    for method in medusa:
        out = method.generate([3, 1, 4], params, k=3)
        assert out.token_ids == reference and out.stats.drafted_tokens > 0
    decoder = SpeculativeDecoder(tiny_target, f"medusa:{trained[0]}")
    feature = tiny_target.module.config.hidden_size * tiny_target.dtype.itemsize  # kept per token, no KV cache
    assert cache_bytes_per_token(decoder) == cache_bytes_per_token(SpeculativeDecoder(tiny_target)) + feature
    weights = sum(p.numel() * p.element_size() for p in decoder.drafter.inner.head.parameters())
    line = next(line for line in memory_report(decoder, ServerConfig(model_name="tiny")) if "Medusa" in line)
    assert f"{weights / 2**20:,.1f} MiB" in line

"""The lean forward (quickdraft.models.lean) against transformers' own forward of the same model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import make_tiny_model, make_tiny_qwen2
from quickdraft.kernels import int4_kernel
from quickdraft.models.int4 import Int4Linear
from quickdraft.batch.runner import BatchRunner
from quickdraft.runner import ModelRunner

FAMILIES = {
    "llama": lambda: make_tiny_model(seed=3, vocab_size=16),
    "qwen2": lambda: make_tiny_qwen2(seed=3),
}


def _reference(model, sequence: list[int]) -> torch.Tensor:
    """``[V]`` the next-token logits of ``sequence`` by transformers, with no cache."""
    with torch.inference_mode():
        return model.module(torch.tensor([sequence])).logits[0, -1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_lean_forward_gives_transformers_logits_through_steps_and_rollbacks(family):
    model = FAMILIES[family]()
    assert model.lean is not None
    runner = ModelRunner(model)
    sequence = [3, 1, 4, 1, 5, 9, 2]
    # A prompt, one token, several, a rollback of three then one more, one token, several: each
    # (sequence, rows) feeds ``rows`` positions (the prompt all 7); the rows of several fed
    # positions show that each reads only the positions before it.
    feeds = [(sequence, 3), (sequence + [6], 1), (sequence + [6, 5, 3, 5], 3), (sequence + [6, 8], 1),
             (sequence + [6, 8, 9], 1), (sequence + [6, 8, 9, 7, 9, 3], 3)]
    for fed, rows in feeds:
        logits = runner.forward_tail(fed, num_logits=rows)  # [rows, V]
        for row, end in zip(logits, range(len(fed) - rows + 1, len(fed) + 1)):
            torch.testing.assert_close(row, _reference(model, fed[:end]), rtol=1e-5, atol=1e-5)
    assert runner.forwards == len(feeds) and runner.positions == 7 + 1 + 3 + 1 + 1 + 3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_lean_forward_attends_a_tree_as_its_mask_says(family):
    model = FAMILIES[family]()
    runner = ModelRunner(model)
    sequence = [3, 1, 4, 1, 5]
    tokens, parents = [9, 2, 6, 5], [-1, -1, 0, 1]  # two branches below the root, one deeper each
    logits = runner.forward_tree(sequence, tokens, parents, num_logits=len(tokens) + 1)  # [5, V]
    paths = [sequence, sequence + [9], sequence + [2], sequence + [9, 6], sequence + [2, 5]]
    for row, path in zip(logits, paths):
        torch.testing.assert_close(row, _reference(model, path), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_lean_forward_gives_each_row_of_a_batch_its_own_logits(family):
    """The batched engine's rows: other lengths and positions, padding, one or several tokens a
    row, a rollback, a row leaving (the last row takes its place); every row's logits are its
    own sequence's alone."""
    model = FAMILIES[family]()
    runner = BatchRunner(model)
    sequences = [[3, 1, 4, 1, 5, 9, 2], [2, 7], [1, 8, 2, 8]]
    for row, sequence in enumerate(sequences):
        runner.add_row()
        runner.forward(row, [sequence[:-1]], [0])  # prompts, one row at a time
    steps = [([[2], [7], [8]], [1, 1, 1]),  # the prompts' last tokens
             ([[6, 5, 3], [], [4]], [3, 0, 1]),  # several tokens, none, one
             ([[5, 8], [1, 8, 2], [9]], [2, 3, 1])]
    for tokens, num_logits in steps:
        fed = [sequence + list(t) for sequence, t in zip(sequences, tokens)]
        logits = runner.forward_tails(0, fed, num_logits)
        for row, (sequence, n) in enumerate(zip(fed, num_logits)):
            for i in range(n):
                end = len(sequence) - n + 1 + i
                torch.testing.assert_close(logits[row][i], _reference(model, sequence[:end]), rtol=1e-5, atol=1e-5)
        sequences = fed
    runner.truncate(0, 8)  # row 0 rolls back to 8 positions
    sequences[0] = sequences[0][:8]
    runner.remove_row(1)  # row 2 becomes row 1
    sequences = [sequences[0] + [4], sequences[2] + [3]]
    logits = runner.forward_tails(0, sequences, [1, 1])
    for row, sequence in enumerate(sequences):
        torch.testing.assert_close(logits[row][0], _reference(model, sequence), rtol=1e-5, atol=1e-5)


def test_families_it_does_not_compute_run_through_transformers():
    sliding = make_tiny_qwen2(seed=3, sliding_window=4)
    assert sliding.lean is None
    runner = ModelRunner(sliding)
    sequence = [3, 1, 4, 1, 5, 9]
    torch.testing.assert_close(runner.forward_tail(sequence)[0], _reference(sliding, sequence), rtol=1e-5, atol=1e-5)


def test_fused_int4_layers_give_each_layer_s_output_and_hold_no_weight_twice():
    kernel = int4_kernel()
    if kernel is None:
        pytest.skip("the int4 kernel does not run on this machine (no AVX2, or no C compiler)")
    generator = torch.Generator().manual_seed(0)
    layers = []
    for out, bias in ((48, True), (16, False), (40, True)):
        linear = nn.Linear(200, out, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out, 200, generator=generator) * 0.05)
        layers.append(Int4Linear(linear, kernel))
    x = torch.randn(1, 3, 200, generator=generator)
    apart = [layer(x) for layer in layers]
    fused = Int4Linear.fused(layers)
    # Each output row is computed from the same quantized input row either way: the same bits.
    assert torch.equal(fused(x), torch.cat(apart, dim=-1))
    assert all(torch.equal(layer(x), want) for layer, want in zip(layers, apart))
    again = Int4Linear.fused(layers)  # the same model wrapped twice
    for name in ("packed", "scale", "corr", "bias"):
        assert all(getattr(layer, name).untyped_storage().data_ptr() == getattr(fused, name).untyped_storage().data_ptr()
                   for layer in layers)
        assert getattr(again, name).data_ptr() == getattr(fused, name).data_ptr()
    assert torch.equal(again(x), torch.cat(apart, dim=-1))


def test_the_attention_gives_the_same_bits_on_one_thread_as_on_several():
    # The lean forward runs small attentions on one thread (``ONE_THREAD_ATTENTION``): how many
    # rows share a call decides which, so a row's result must not depend on it.
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, 2, 12, 16, generator=generator) for _ in range(3))
    mask = torch.randn(3, 1, 12, 12, generator=generator)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        several = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.set_num_threads(1)
        one = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)

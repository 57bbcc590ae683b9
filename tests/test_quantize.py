"""Int8 and int4 draft models: cheaper drafts, the same output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import chi_square_p_value, make_tiny_model
from quickdraft import FixedK, InvalidParameterError, SamplingParams, SpeculativeDecoder, load_model
from quickdraft.memory import weight_bytes
from quickdraft import runner
from quickdraft.kernels import int4_kernel
from quickdraft.models import quantize as quantize_module
from quickdraft.models.int4 import Int4Linear
from quickdraft.models.quantize import quantize
from quickdraft.runner import OutputRows
from helpers import plain_greedy
from helpers import LENGTH, PROMPT, sample_counts
from conftest import exact_continuation_probs


@pytest.fixture(scope="module")
def int8_draft():
    """The tiny draft (seed 2, as ``tiny_draft``) with int8 linear layers."""
    return quantize(make_tiny_model(seed=2, name="tiny-draft-int8"), "int8")


def test_every_linear_layer_but_the_output_layer_is_int8(int8_draft):
    module = int8_draft.module
    assert int8_draft.quantization == "int8" and int8_draft.precision == "float32 + int8 weights"
    assert isinstance(module.get_output_embeddings(), nn.Linear)
    float_linears = [n for n, m in module.named_modules() if type(m) is nn.Linear]
    assert float_linears == ["lm_head"]
    # The int8 layers' weights are counted, one byte each (biases: the tiny Llama has none), and
    # the embedding and the output layer two bytes each.
    plain = make_tiny_model(seed=2)
    assert int8_draft.num_parameters() == plain.num_parameters()
    linear = sum(m.weight.numel() for n, m in plain.module.named_modules() if type(m) is nn.Linear and n != "lm_head")
    tables = plain.module.get_input_embeddings().weight.numel() + plain.module.lm_head.weight.numel()
    assert weight_bytes(int8_draft) == weight_bytes(plain) - 3 * linear - 2 * tables


def test_the_embedding_and_output_layer_are_held_in_bfloat16_around_float32_activations(int8_draft):
    module, plain = int8_draft.module, make_tiny_model(seed=2).module
    for layer, original in [(module.get_input_embeddings(), plain.get_input_embeddings()),
                            (module.lm_head, plain.lm_head)]:
        assert layer.weight.dtype == torch.bfloat16 and "weight" in layer._buffers
        assert torch.equal(layer.weight, original.weight.detach().to(torch.bfloat16))
    assert int8_draft.dtype == torch.float32  # transformers reads it from the first parameter
    ids = torch.tensor([[3, 1, 4]])
    embedded = module.get_input_embeddings()(ids)
    assert embedded.dtype == torch.float32
    assert torch.equal(embedded, plain.get_input_embeddings().weight.detach().to(torch.bfloat16)[ids].float())
    hidden = torch.randn(2, plain.config.hidden_size)
    expected = (hidden.to(torch.bfloat16) @ plain.lm_head.weight.detach().to(torch.bfloat16).T).float()
    assert torch.equal(module.lm_head(hidden), expected)


def test_a_tied_output_layer_keeps_sharing_the_embedding():
    model = make_tiny_model(seed=2)
    model.module.lm_head.weight = model.module.get_input_embeddings().weight
    count = model.num_parameters()  # the tied table once
    quantize(model, "int8")
    assert model.module.lm_head.weight is model.module.get_input_embeddings().weight
    assert model.module.lm_head.weight.dtype == torch.bfloat16
    assert model.num_parameters() == count


def test_output_rows_of_a_bfloat16_layer_compute_in_float32_without_bfloat16_kernels(int8_draft, monkeypatch):
    """Where oneDNN has no bfloat16 kernels the rows are unpacked float32, and so is the product."""
    monkeypatch.setattr(runner, "native_bfloat16", lambda device: False)
    weight = int8_draft.module.lm_head.weight  # [V, H] bfloat16
    rows = OutputRows(weight, torch.tensor([1, 5]), int8_draft.vocab_size)
    hidden = torch.randn(3, weight.shape[1])
    logits = rows.logits(hidden)
    assert logits.dtype == torch.float32 and not rows.packed and rows.weight.dtype == torch.float32
    assert torch.equal(logits[:, [1, 5]], hidden @ weight[[1, 5]].float().T)
    assert torch.isinf(logits[:, [0, 2, 3, 4, 6, 7]]).all()
    assert torch.equal(rows.product(hidden, weight[[2]]), hidden @ weight[[2]].float().T)
    halves = rows.logits(hidden.to(torch.bfloat16))  # a bfloat16 model's hidden states
    assert halves.dtype == torch.bfloat16
    assert torch.equal(halves[:, [1, 5]], (hidden.to(torch.bfloat16).float() @ weight[[1, 5]].float().T).to(torch.bfloat16))


def test_an_int8_draft_changes_the_draft_not_the_output(tiny_target, tiny_draft, int8_draft):
    prompt = [3, 1, 4, 1]
    logits = [m.module(input_ids=torch.tensor([prompt])).logits[0, -1] for m in (tiny_draft, int8_draft)]
    assert not torch.equal(*logits) and torch.allclose(*logits, atol=0.5)  # int8 rounding, same model
    _assert_plain_greedy_with(tiny_target, int8_draft, prompt)


def _assert_plain_greedy_with(target, draft, prompt):
    """The draft drafts, and the output is the target's own greedy output."""
    out = SpeculativeDecoder(target, draft, num_speculative_tokens=3).generate(prompt, SamplingParams(max_new_tokens=30))
    assert out.token_ids == plain_greedy(target, prompt, 30)
    assert out.stats.drafted_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["int8_draft", "int4_draft"])
def test_sampling_with_a_quantized_draft_keeps_the_target_distribution(tiny_target, draft, request):
    params = lambda seed: SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, request.getfixturevalue(draft), num_speculative_tokens=2,
                                 policy=FixedK(2), prompt_lookup=False)
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.parametrize("options,message", [
    ({"quantization": "int8", "dtype": "bfloat16"}, "float32"),
    ({"quantization": "int4", "dtype": "bfloat16"}, "float32"),
    ({"quantization": "int2"}, "one of none, int8, int4"),
])
def test_impossible_quantizations_are_refused_before_loading(options, message):
    with pytest.raises(InvalidParameterError, match=message):
        load_model("/nonexistent/model", **options)


def test_int4_is_refused_with_what_to_do_where_its_kernel_does_not_run(monkeypatch):
    monkeypatch.setattr(quantize_module, "int4_kernel", lambda: None)
    with pytest.raises(InvalidParameterError, match="quantization='int8'"):
        quantize(make_tiny_model(seed=2), "int4")


@pytest.fixture(scope="module")
def int4_draft():
    """The tiny draft (seed 2, as ``tiny_draft``) with int4 linear layers."""
    if int4_kernel() is None:
        pytest.skip("the int4 kernel does not run on this machine (no AVX2, or no C compiler)")
    return quantize(make_tiny_model(seed=2, name="tiny-draft-int4"), "int4")


def test_every_linear_layer_but_the_output_layer_is_int4(int4_draft):
    module = int4_draft.module
    assert int4_draft.quantization == "int4" and int4_draft.precision == "float32 + int4 weights"
    assert [n for n, m in module.named_modules() if type(m) is nn.Linear] == ["lm_head"]
    plain = make_tiny_model(seed=2)
    assert int4_draft.num_parameters() == plain.num_parameters()
    layers = [m for m in module.modules() if isinstance(m, Int4Linear)]
    assert layers
    for layer in layers:  # half a byte a weight (inputs padded to 128) and a float32 scale per 64
        padded = -(-layer.in_features // 128) * 128
        assert layer.packed.dtype == torch.uint8 and layer.packed.shape == (layer.out_features, padded // 2)
        assert layer.scale.shape == (layer.out_features, padded // 64)


def test_an_int4_draft_changes_the_draft_not_the_output(tiny_target, tiny_draft, int4_draft):
    prompt = [3, 1, 4, 1]
    logits = [m.module(input_ids=torch.tensor([prompt])).logits[0, -1] for m in (tiny_draft, int4_draft)]
    # int4 rounding of a 16-wide random model: the same model, coarsely
    assert not torch.equal(*logits) and torch.corrcoef(torch.stack(logits))[0, 1] > 0.8
    _assert_plain_greedy_with(tiny_target, int4_draft, prompt)

"""The GGUF block kernel and models run from their own blocks (``quickdraft.models.blocks``,
``gguf_blocks``, ``kernels/block_rows.c``): the file's numbers, dequantized bit for bit as the
``gguf`` package does; products equal to the dequantized weight's with the activations quantized
as the kernel does; and a tiny quantized model that decodes and samples as its reference."""

from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from conftest import chi_square_p_value, exact_continuation_probs
from gguf_models import write_tiny_gguf
from helpers import LENGTH, PROMPT, sample_counts
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder
from quickdraft.kernels import block_kernel
from quickdraft.models.blocks import BlockEmbedding, BlockLinear
from quickdraft.models.gguf_file import GGUFFile
from quickdraft.models.loading import load_model

KERNEL = block_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="the block kernel does not run here")
# Bytes per block and weights per block of each type the kernel runs.
SIZES = {T.Q4_K: (144, 256), T.Q6_K: (210, 256), T.Q4_0: (18, 32), T.Q8_0: (34, 32)}


def paths() -> list:
    """The kernel's paths this CPU runs: AVX2 always, AVX-512 VNNI where it has it."""
    if KERNEL is None:
        return []
    avx2 = copy.copy(KERNEL)
    avx2.vnni = False
    return [pytest.param(avx2, id="avx2")] + ([pytest.param(KERNEL, id="vnni")] if KERNEL.vnni else [])


def random_blocks(kind: T, out: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """``[out, row_bytes]`` random blocks of ``kind``: random bytes, with the fp16 scales set to
    small positive values (every byte pattern is a valid block otherwise)."""
    size, per = SIZES[kind]
    blocks = torch.randint(0, 256, (out, inputs // per, size), dtype=torch.uint8, generator=generator)

    def scale() -> torch.Tensor:
        halves = (torch.rand(out, inputs // per, generator=generator) * 0.01 + 0.001).half()
        return halves.view(torch.uint8).view(out, inputs // per, 2)

    at = 208 if kind == T.Q6_K else 0
    blocks[..., at : at + 2] = scale()
    if kind == T.Q4_K:
        blocks[..., 2:4] = scale()
    return blocks.reshape(out, -1).contiguous()


def reference_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [rows, in] @ weight.T`` with each row of ``x`` quantized to int8 per 256 inputs
    (scale amax / 127, round to nearest even) as the kernel quantizes it, summed in float64."""
    rows, inputs = x.shape
    pad = -inputs % 256
    blocks = torch.nn.functional.pad(x, (0, pad)).view(rows, -1, 256)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    w = torch.nn.functional.pad(weight, (0, pad)).view(weight.shape[0], -1, 256)
    return torch.einsum("rbk,obk,rb->ro", q.double(), w.double(), (amax / 127).squeeze(-1).double())


@pytest.mark.parametrize("kind", list(SIZES))
def test_dequantized_blocks_are_the_gguf_package_s_bit_for_bit(kind):
    blocks = random_blocks(kind, 9, 512, torch.Generator().manual_seed(0))
    expected = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), kind).copy())
    assert torch.equal(KERNEL.dequantize(blocks, kind.value, torch.arange(9), 512), expected)
    rows = torch.tensor([4, 0, 4])
    assert torch.equal(KERNEL.dequantize(blocks, kind.value, rows, 512), expected[rows])


@pytest.mark.parametrize("kernel", paths())
@pytest.mark.parametrize("kind", list(SIZES))
@pytest.mark.parametrize("rows", [1, 6, 16, 19])
def test_product_is_the_dequantized_weight_s(kernel, kind, rows):
    generator = torch.Generator().manual_seed(rows)
    inputs = 768 if SIZES[kind][1] == 256 else 352  # 352: Q4_0 / Q8_0 rows not a multiple of 256
    blocks = random_blocks(kind, 37, inputs, generator)
    weight = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), kind).copy())
    x = torch.randn(rows, inputs, generator=generator)
    expected = reference_product(x, weight)
    got = kernel.linear(x, blocks, kind.value).double()
    # float32 sums against float64: a sub-block's wrong scale or nibble would be off by O(1).
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-3


@pytest.mark.parametrize("kernel", paths())
def test_a_row_s_result_does_not_depend_on_the_rows_beside_it(kernel):
    generator = torch.Generator().manual_seed(3)
    blocks = random_blocks(T.Q4_K, 21, 512, generator)
    x = torch.randn(20, 512, generator=generator)
    together = kernel.linear(x, blocks, T.Q4_K.value)
    for row in (0, 7, 16, 19):  # in the first and the second pass of 16 rows
        assert torch.equal(kernel.linear(x[row : row + 1].contiguous(), blocks, T.Q4_K.value)[0], together[row])


def test_fused_layers_compute_what_they_computed_apart():
    generator = torch.Generator().manual_seed(4)
    layers = [BlockLinear(random_blocks(T.Q4_K, out, 256, generator), T.Q4_K.value, 256, KERNEL, torch.randn(out))
              for out in (32, 16, 16)]
    x = torch.randn(3, 256, generator=generator)
    apart = torch.cat([layer(x) for layer in layers], dim=-1)
    fused = BlockLinear.fused(layers)
    assert torch.equal(fused(x), apart)
    assert torch.equal(torch.cat([layer(x) for layer in layers], dim=-1), apart)  # views of the fused blocks
    other = BlockLinear(random_blocks(T.Q6_K, 16, 256, generator), T.Q6_K.value, 256, KERNEL)
    assert BlockLinear.fused([layers[0], other]) is None  # Q4_K next to Q6_K: kept apart


def test_the_file_reader_reads_what_the_gguf_package_reads(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0, kinds={"output": T.Q8_0})
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert ours.architecture == "qwen2" and ours.metadata["qwen2.block_count"] == 2
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for tensor in theirs.tensors:
        info = ours.tensors[tensor.name]
        assert info.kind == tensor.tensor_type and list(info.shape) == [int(n) for n in tensor.shape]
        assert np.array_equal(ours.data(tensor.name).reshape(-1), np.asarray(tensor.data).view(np.uint8).reshape(-1))


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("llama", True)])
def test_a_gguf_runs_from_its_blocks_and_computes_its_dequantized_model(tmp_path, monkeypatch, arch, tied):
    kinds = {"attn_v": T.Q4_0, "ffn_down": T.Q8_0, "output": T.Q8_0}
    path, reference = write_tiny_gguf(tmp_path / "tiny.gguf", seed=1, arch=arch, kinds=kinds, tied=tied)
    model = load_model(path)  # quantization="auto": a 4-bit GGUF runs from its blocks
    layers = model.module.model.layers[0]
    assert isinstance(layers.self_attn.v_proj, BlockLinear) and layers.self_attn.v_proj.kind == T.Q4_0.value
    assert isinstance(model.module.lm_head, BlockLinear) and isinstance(model.module.model.embed_tokens, BlockEmbedding)
    assert model.precision == "float32 + Q4_0/Q4_K/Q8_0 weights" and model.vocab_size == 8
    ids = torch.tensor([[3, 1, 4, 1, 5, 2, 6]])
    with torch.inference_mode():
        got, expected = model.module(input_ids=ids).logits, reference(input_ids=ids).logits
        # The kernel quantizes the activations to int8 per 256 inputs: a few percent off.
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 0.08
        # With the blocks' dequantized weights in float32, the model is the reference exactly:
        # every tensor in its place, llama's query and key rows in transformers' order.
        monkeypatch.setattr(BlockLinear, "forward", lambda self, x: torch.nn.functional.linear(x, self.weight, self.bias))
        assert torch.equal(model.module(input_ids=ids).logits, expected)


@pytest.fixture(scope="module")
def quantized_target(tmp_path_factory):
    path, _ = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "target.gguf", seed=5, init_scale=0.1,
                              kinds={"attn_v": T.Q4_0, "output": T.Q8_0})
    return load_model(path, quantization="int4")


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_output_is_the_quantized_target_s(quantized_target, tiny_draft, k):
    decoder = SpeculativeDecoder(quantized_target, tiny_draft, num_speculative_tokens=k, policy=FixedK(k))
    plain = SpeculativeDecoder(quantized_target, None)
    accepted = 0
    for prompt in ([3], [3, 1, 4], [0, 7, 7, 1, 2, 6, 3, 3, 4]):
        params = SamplingParams(max_new_tokens=30)
        out = decoder.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids
        accepted += out.stats.accepted_tokens
    assert accepted > 0  # some drafts were verified and kept, not only rejected


@pytest.mark.slow
def test_speculative_sampling_keeps_the_quantized_target_s_distribution(quantized_target, tiny_draft):
    params = lambda seed: SamplingParams(temperature=1.0, max_new_tokens=LENGTH, seed=seed)  # noqa: E731
    exact = exact_continuation_probs(quantized_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(quantized_target, tiny_draft, num_speculative_tokens=2, policy=FixedK(2),
                                 prompt_lookup=False)
    counts = sample_counts(decoder, params, quantized_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3
    wrong = exact_continuation_probs(tiny_draft, PROMPT, LENGTH, params(0))
    assert chi_square_p_value(counts, wrong) < 1e-6


def test_a_verified_position_s_logits_are_plain_decoding_s_bit_for_bit(quantized_target):
    """Logits of positions fed several at a time (a verification) equal those fed one at a time
    (plain decoding), bit for bit: the block layers round their inputs to int8, so a last-bit
    difference in the attention could flip a rounding and change a greedy token at a near-tie.
    (With the chain attended in one masked call, ``lean.ROW_BY_ROW_POSITIONS = 0``, all three
    chunkings differed here.)"""
    from quickdraft.runner import ModelRunner

    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, quantized_target.vocab_size, (40,), generator=generator).tolist()

    def logits(chunk: int) -> torch.Tensor:
        runner = ModelRunner(quantized_target)
        rows = [runner.forward(tokens[:8], 1)]
        for start in range(8, len(tokens), chunk):
            piece = tokens[start:start + chunk]
            rows.append(runner.forward(piece, len(piece)))
        return torch.cat(rows)  # [33, V]

    one = logits(1)
    same = [torch.equal(logits(chunk), one) for chunk in (2, 6, 16)]
    assert same == [True] * 3

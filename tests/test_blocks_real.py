"""The demo target run from its own Q4_K_M blocks: marked real_model (needs the demo packages).

It loads from its GGUF by default, its real Q4_K and Q6_K tensors multiply as their dequantized
weights do, it decodes what llama.cpp and transformers decode, and speculation with the demo
draft emits exactly its plain greedy output.
"""

from __future__ import annotations

import gguf
import pytest
import torch

from conftest import requires_demo
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder, load_model
from quickdraft.models.blocks import BlockEmbedding, BlockLinear
from quickdraft.models.demo import demo_gguf_file
from quickdraft.models.gguf_file import GGUFFile
from test_blocks import KERNEL, reference_product

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"

pytestmark = [pytest.mark.real_model, requires_demo(TARGET, DRAFT),
              pytest.mark.skipif(KERNEL is None, reason="the block kernel does not run here")]


@pytest.fixture(scope="module")
def target():
    return load_model(TARGET)


@pytest.mark.parametrize("name", ["blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "output.weight"])
def test_real_tensors_multiply_as_their_dequantized_weights(name):
    file = GGUFFile(demo_gguf_file(TARGET))
    info = file.tensors[name]
    blocks = torch.from_numpy(file.data(name)[:512].copy())  # the first 512 outputs
    weight = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), info.kind).copy())
    x = torch.randn(6, info.shape[0], generator=torch.Generator().manual_seed(0))
    expected = reference_product(x, weight)
    got = KERNEL.linear(x, blocks, info.kind.value).double()
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-3


def test_the_demo_target_runs_from_its_blocks_and_decodes_as_llama_cpp_does(target):
    assert target.precision == "float32 + Q4_K/Q6_K weights"
    assert isinstance(target.module.lm_head, BlockLinear) and target.module.lm_head.kind == gguf.GGMLQuantizationType.Q6_K
    assert isinstance(target.module.model.embed_tokens, BlockEmbedding)
    out = SpeculativeDecoder(target, None).generate("The capital of France is", SamplingParams(max_new_tokens=12))
    # llama.cpp and transformers (float32 from the same file) decode this too.
    assert target.tokenizer.decode(out.token_ids).startswith(" Paris. Paris is the largest city in France")


def test_greedy_speculation_with_the_demo_draft_is_the_target_s_output(target):
    draft = load_model(DRAFT, dtype="float32", quantization="int4")
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=5, policy=FixedK(5))
    plain = SpeculativeDecoder(target, None)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    for prompt in ("def fibonacci(n):", "The three most important ideas in thermodynamics are"):
        out = decoder.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids
        assert out.stats.accepted_tokens > 0

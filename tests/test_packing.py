"""Packed linear layers on the CPU (bfloat16 and float32): the same numbers as stock layers, fewer copies."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from conftest import make_tiny_model, requires_demo
from quickdraft import SamplingParams, SpeculativeDecoder, load_model
from quickdraft.bench.methods import build_methods
from quickdraft.hardware import machine_config
from quickdraft.kernels import bf16_tiles_kernel, int4_kernel
from quickdraft.memory import weight_bytes
from quickdraft.models import packing, widening
from quickdraft.models.packing import (KERNEL_MAX_ROWS, WIDEN_FROM_ROWS, PackedLinear, TiledLinear, WidenedLinear, can_pack,
                                       has_packed_layers, native_bfloat16, pack_linear_layers)
from quickdraft.models.quantize import quantize
from quickdraft.runner import ModelRunner

requires_int4 = pytest.mark.skipif(int4_kernel() is None, reason="the int4 kernel does not run on this machine")
requires_bf16 = pytest.mark.skipif(not native_bfloat16(torch.device("cpu")),
                                   reason="this CPU's oneDNN has no bfloat16 kernels")
requires_onednn = pytest.mark.skipif(not can_pack(torch.float32, torch.device("cpu")), reason="torch runs no oneDNN here")
requires_tiles = pytest.mark.skipif(bf16_tiles_kernel() is None, reason="this CPU has no AMX-BF16 tiles for the kernel")


@pytest.fixture
def no_tiles(monkeypatch):
    """bfloat16 layers packed for oneDNN, as on a CPU without AMX tiles."""
    monkeypatch.setattr(packing, "bf16_tiles_kernel", lambda: None)


def _tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    """A random Qwen2 (biases on q, k, v; tied embeddings), wide enough for oneDNN to block."""
    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, initializer_range=0.5)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def _pair(seed: int, dtype: str = "bfloat16"):
    """The same random Qwen2 twice in ``dtype``: packed, and with stock layers."""
    return (load_model(_tiny_qwen2(seed), dtype=dtype, pack_weights=True),
            load_model(_tiny_qwen2(seed), dtype=dtype, pack_weights=False))


@requires_bf16
def test_every_linear_layer_but_the_output_layer_is_packed():
    packed, stock = _pair(0)
    module = packed.module
    assert has_packed_layers(packed) and not has_packed_layers(stock)
    assert type(module.get_output_embeddings()) is nn.Linear
    assert module.get_output_embeddings().weight is module.get_input_embeddings().weight  # still tied
    assert [n for n, m in module.named_modules() if type(m) is nn.Linear] == ["lm_head"]
    q = module.model.layers[0].self_attn.q_proj
    if bf16_tiles_kernel() is not None:
        assert isinstance(q, TiledLinear) and q.weight.dtype == torch.bfloat16 and q.bias is not None
    else:
        assert isinstance(q, PackedLinear) and q.weight.is_mkldnn and q.bias is not None
    # Same weights, same count and bytes: the packed copy replaces the stock one.
    assert packed.num_parameters() == stock.num_parameters()
    assert weight_bytes(packed) == weight_bytes(stock)


@requires_bf16
@pytest.mark.parametrize("length", [1, 6, 40])
def test_packed_layers_give_bit_identical_logits(no_tiles, length):
    packed, stock = _pair(1)
    ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        got, want = (m.module(input_ids=ids).logits for m in (packed, stock))
    assert torch.equal(got, want)


@requires_onednn
@pytest.mark.parametrize("length", [1, 6, 40])
def test_packed_float32_layers_compute_the_stock_logits(length):
    """Another kernel (oneDNN's, not MKL's), so the sums differ in the last bits: 1e-6 of logits of about 1."""
    packed, stock = _pair(1, "float32")
    assert has_packed_layers(packed)
    ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        got, want = (m.module(input_ids=ids).logits for m in (packed, stock))
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [pytest.param("bfloat16", marks=requires_bf16),
                                   pytest.param("float32", marks=requires_onednn)])
def test_greedy_through_packed_layers_equals_stock_transformers_generate(dtype):
    packed, stock = _pair(2, dtype)
    prompt = [5, 17, 3, 17, 5]
    with torch.inference_mode():
        want = stock.module.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                                     max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    draft = load_model(_tiny_qwen2(3), dtype=dtype)
    for decoder in (SpeculativeDecoder(packed, None), SpeculativeDecoder(packed, draft, num_speculative_tokens=3)):
        out = decoder.generate(prompt, SamplingParams(max_new_tokens=24, ignore_eos=True))
        assert out.token_ids == want[0, len(prompt):].tolist()


def _bfloat16_linear(out_features: int, in_features: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)


@requires_tiles
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_features, in_features", [(40, 24), (64, 96), (33, 200)])
def test_tiled_layers_round_float32_sums_once_each_row_as_it_runs_alone(bias, out_features, in_features):
    """Shapes that are whole tiles and shapes that are not; 1 to 40 rows (one, two and three
    blocks of 16). Each output is the float32 sum rounded to bfloat16: within half a bfloat16
    step of the exact value, beyond float32's own rounding; and a row among others is that row
    alone, bit for bit."""
    stock = _bfloat16_linear(out_features, in_features, bias, out_features)
    layer = TiledLinear(stock)
    assert layer.weight.numel() == -(-out_features // 32) * 32 * -(-in_features // 32) * 32
    x = torch.randn(1, 40, in_features, generator=torch.Generator().manual_seed(in_features)).to(torch.bfloat16)
    got = layer(x)
    assert got.shape == (1, 40, out_features) and got.dtype == torch.bfloat16
    exact = nn.functional.linear(x.double(), stock.weight.double(), None if stock.bias is None else stock.bias.double())
    step = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)  # a bfloat16 step at each value
    assert ((got.double() - exact).abs() <= 0.5 * step + 1e-5 * exact.abs().amax()).all()
    for rows in (slice(0, 1), slice(17, 18), slice(39, 40), slice(5, 21)):
        assert torch.equal(layer(x[:, rows]), got[:, rows])


@requires_tiles
@pytest.mark.parametrize("length", [1, 6, 40])
def test_tiled_layers_compute_the_stock_logits(length):
    """Another kernel than the stock layer's: the same float32 sums in another order, rounded to
    bfloat16 at each layer (the same argmax, within a few bfloat16 steps)."""
    packed, stock = _pair(1)
    assert isinstance(packed.module.model.layers[0].mlp.down_proj, TiledLinear)
    ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        got, want = (m.module(input_ids=ids).logits.float() for m in (packed, stock))
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.parametrize("rows", range(1, WIDEN_FROM_ROWS))
def test_without_the_kernel_widened_layers_run_few_rows_as_the_stock_layer(monkeypatch, rows):
    monkeypatch.setattr(packing, "bf16_rows_kernel", lambda: None)
    stock = _bfloat16_linear(40, 24, True, rows)
    x = torch.randn(rows, 24).to(torch.bfloat16)
    assert torch.equal(WidenedLinear(stock)(x), stock(x))


@pytest.mark.parametrize("bias", [False, True])
def test_widened_layers_run_few_rows_by_the_kernel_each_row_as_it_runs_alone(monkeypatch, bias):
    """Up to ``KERNEL_MAX_ROWS`` rows: float32's sums rounded once, and each row's output the
    same bits as that row run alone (a verification's rows are plain decoding's)."""
    calls = []
    kernel = packing.bf16_rows_kernel()
    if kernel is None:
        pytest.skip("the few-row kernel does not run on this machine")
    monkeypatch.setattr(packing, "bf16_rows_kernel", lambda: calls.append(1) or kernel)
    stock = _bfloat16_linear(40, 24, bias, 2)
    layer = WidenedLinear(stock)
    x = torch.randn(1, KERNEL_MAX_ROWS, 24, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = layer(x)
    assert calls and got.shape == (1, KERNEL_MAX_ROWS, 40) and got.dtype == torch.bfloat16
    want = nn.functional.linear(x.float(), stock.weight.float(), None if stock.bias is None else stock.bias.float())
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    for row in (0, 5, KERNEL_MAX_ROWS - 1):
        assert torch.equal(layer(x[:, row:row + 1]), got[:, row:row + 1])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block_rows", [1, 7, 64])
def test_widened_layers_compute_many_rows_in_float32_block_by_block(monkeypatch, bias, block_rows):
    """Blocks of 1 and 7 weight rows (40 = 5 x 7 + 5: a short last block) and one block of all;
    a float32 input keeps the float32 sums, to compare them with float32's product."""
    monkeypatch.setattr(widening, "WIDEN_BLOCK", block_rows * 24)
    monkeypatch.setattr(packing, "KERNEL_MAX_ROWS", 0)  # 10 rows: blocks, not the few-row kernel
    stock = _bfloat16_linear(40, 24, bias, 1)
    layer = WidenedLinear(stock)
    x = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(block_rows))  # [batch, positions, in]: 10 rows
    want = nn.functional.linear(x, stock.weight.float(), None if stock.bias is None else stock.bias.float())
    got = layer(x)
    assert got.shape == (2, 5, 40) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # another kernel's order of sums
    # bfloat16 in, bfloat16 out: the float32 sums rounded once
    rounded = layer(x.to(torch.bfloat16))
    assert rounded.dtype == torch.bfloat16
    torch.testing.assert_close(rounded.float(), nn.functional.linear(x.to(torch.bfloat16).float(), stock.weight.float(),
                                                                     None if stock.bias is None else stock.bias.float()),
                               rtol=1e-2, atol=1e-2)


def test_without_bfloat16_instructions_packed_bfloat16_is_widened(monkeypatch):
    monkeypatch.setattr(packing, "native_bfloat16", lambda device: False)
    widened, stock = _pair(1)
    q = widened.module.model.layers[0].self_attn.q_proj
    assert isinstance(q, WidenedLinear) and q.weight.dtype == torch.bfloat16 and has_packed_layers(widened)
    assert weight_bytes(widened) == weight_bytes(stock)  # the bfloat16 weights themselves, no copy
    output = widened.module.get_output_embeddings()
    assert isinstance(output, WidenedLinear) and output.weight is widened.module.get_input_embeddings().weight
    with torch.inference_mode():
        for length in (1, 6, 40):
            ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(length))
            got, want = (m.module(input_ids=ids).logits.float() for m in (widened, stock))
            if length < WIDEN_FROM_ROWS and packing.bf16_rows_kernel() is None:
                assert torch.equal(got, want)
            else:  # the same float32 sums in another order, rounded to bfloat16 at each layer
                assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.parametrize("options", [{"dtype": "float32", "pack_weights": False},
                                     {"dtype": "float32", "quantization": "int8"},
                                     pytest.param({"dtype": "float32", "quantization": "int4"}, marks=requires_int4),
                                     {"dtype": "bfloat16", "pack_weights": False}])
def test_quantized_drafts_and_opting_out_keep_stock_layers(options):
    model = load_model(make_tiny_model(seed=4).module, **options)
    assert not has_packed_layers(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_by_default_a_dtype_is_packed_where_the_probe_found_packing_faster(dtype):
    model = load_model(make_tiny_model(seed=4).module, dtype=dtype)
    assert has_packed_layers(model) == machine_config("cpu").packs(dtype)


@requires_bf16
def test_the_transformers_methods_run_stock_layers():
    (target, draft), (stock_target, stock_draft) = zip(_pair(5), _pair(6))
    methods = {m.name: m for m in build_methods(target, draft, ["plain", "hf-plain", "hf-assisted"],
                                                 peer_models=(stock_target, stock_draft))}
    assert methods["hf-plain"].target is stock_target
    assert methods["hf-assisted"].target is stock_target and methods["hf-assisted"].assistant is stock_draft
    assert methods["plain"]._make_decoder(1).target is target


@pytest.mark.real_model
@requires_bf16
@requires_demo("qwen2.5-coder-1.5b-instruct")
def test_the_packed_demo_target_computes_the_stock_logits(real_threads):
    """Prefill, a 6-token verification and one-token steps of the 1.5B target, on every core.

    Bit for bit on an AVX-512 BF16 CPU (the same oneDNN kernel either way); on an AMX CPU the
    one- and six-row products of the packed layout run another kernel, whose sums differ in
    the last bits (logits within 0.14 of the stock ones here): the same argmax, and within a
    few bfloat16 steps of a logit of 10-30."""
    packed, stock = (load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16", pack_weights=p) for p in (True, False))
    assert has_packed_layers(packed)
    prompt = packed.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")["input_ids"]
    runners = [ModelRunner(m) for m in (packed, stock)]
    for feed, num_logits in [(prompt, 1), ([262, 421, 308, 2604, 220, 16], 6), ([470], 1), ([308], 1)]:
        got, want = (r.forward(feed, num_logits) for r in runners)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert (got.float() - want.float()).abs().max() <= 0.25


@pytest.mark.parametrize("options", [pytest.param({"pack_weights": True}, marks=requires_onednn),
                                     {"quantization": "int8"},
                                     pytest.param({"quantization": "int4"}, marks=requires_int4)])
def test_layers_replaced_while_reading_the_files_equal_those_replaced_after(tmp_path, options):
    """Packing and int8 or int4 weights are applied layer by layer as a model's files are read (so that
    the plain weights are never all resident next to their replacements); the model is the one
    replacing every layer of the loaded model gives."""
    _tiny_qwen2(7).save_pretrained(tmp_path)
    read = load_model(tmp_path, dtype="float32", **options)
    stock = load_model(tmp_path, dtype="float32", pack_weights=False)
    after = quantize(stock, options["quantization"]) if "quantization" in options else pack_linear_layers(stock)
    assert [type(m) for m in read.module.modules()] == [type(m) for m in after.module.modules()]
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        assert torch.equal(read.module(input_ids=ids).logits, after.module(input_ids=ids).logits)


def test_a_widened_layer_runs_outside_inference_mode_after_running_inside_it(monkeypatch):
    """The probe runs widened layers in inference mode first; the scratch buffer they share must
    still take a forward's copies outside it."""
    monkeypatch.setattr(packing, "KERNEL_MAX_ROWS", 0)
    monkeypatch.setattr(widening, "_scratch_local", type(widening._scratch_local)())
    layer = WidenedLinear(_bfloat16_linear(40, 24, False, 3))
    x = torch.randn(8, 24).to(torch.bfloat16)
    with torch.inference_mode():
        inside = layer(x)
    assert torch.equal(layer(x), inside)

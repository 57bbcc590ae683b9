"""The compiled kernels: the few-row bfloat16 kernel (float32's sums, rows independent of each
other, and torch's path wherever it cannot be built) and the int4 kernel (the quantized product it
documents, on both ISA paths)."""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch import nn

from quickdraft import kernels
from quickdraft.kernels import Int4Kernel, bf16_rows_kernel, build, int4_kernel
from quickdraft.models.int4 import KERNEL_MAX_ROWS, Int4Linear, dequantize_weight, quantize_weight


@pytest.fixture
def fresh_kernel():
    """``bf16_rows_kernel`` decided again under the test's environment, and again after it."""
    bf16_rows_kernel.cache_clear()
    yield
    bf16_rows_kernel.cache_clear()


def _kernel():
    kernel = bf16_rows_kernel()
    if kernel is None:
        pytest.skip("the few-row kernel does not run on this machine (no AVX2 and FMA, or no C compiler)")
    return kernel


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("out_features, in_features", [(11, 37), (16, 64), (1, 8)])
def test_the_kernel_computes_float32_sums_of_the_bfloat16_weight(rows, out_features, in_features):
    """Odd output counts (the last weight row alone), inputs that are not a multiple of eight (the
    scalar tail), row groups of four and a remainder: against float64's exact product."""
    generator = torch.Generator().manual_seed(rows * 100 + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator).to(torch.bfloat16)
    got = _kernel()(x, weight)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    want = x.double() @ weight.double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """Bit for bit: verification's rows compute what a one-row decode step computes."""
    kernel = _kernel()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(9, 100, generator=generator)
    weight = torch.randn(23, 100, generator=generator).to(torch.bfloat16)
    together = kernel(x, weight)
    for row in range(9):
        assert torch.equal(kernel(x[row:row + 1].contiguous(), weight)[0], together[row])


def test_the_kernel_is_off_where_asked_or_without_a_compiler(monkeypatch, tmp_path, fresh_kernel):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setenv(kernels.ENV, "0")
    assert bf16_rows_kernel() is None
    bf16_rows_kernel.cache_clear()
    monkeypatch.delenv(kernels.ENV)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert bf16_rows_kernel() is None
    assert not (tmp_path / "kernels").exists() or not list((tmp_path / "kernels").iterdir())


def test_a_compiler_error_is_reported_with_its_output(tmp_path):
    source = tmp_path / "broken.c"
    source.write_text("int f( {\n")
    with pytest.raises(RuntimeError, match="broken.c"):
        build(source, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())  # no partial library left behind


def test_a_built_library_is_reused(tmp_path):
    _kernel()  # a compiler that builds the kernel is here
    first = build(directory=tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build(directory=tmp_path) == first and first.stat().st_mtime_ns == stamp


# ---------------------------------------------------------------------------------------------
# The int4 kernel


def _int4_kernels() -> list[Int4Kernel]:
    """The kernel as this machine runs it, its VNNI path for many rows where those run on AMX
    tiles, and its AVX2 paths where those are AVX-512 ones."""
    kernel = int4_kernel()
    if kernel is None:
        pytest.skip("the int4 kernel does not run on this machine (no AVX2, or no C compiler)")
    library = ctypes.CDLL(str(build(kernels.INT4_SOURCE)))
    avx2 = Int4Kernel(library, avx512=False, vnni=False)
    no_amx = [Int4Kernel(library, avx512=True, vnni=kernel.vnni)] if kernel.amx else []
    return [kernel, *no_amx, avx2] if kernel.avx512 else [kernel]


def _int4_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: each row of x rounded to int8 with one scale (amax /
    127, multiplied by its float32 inverse as the kernel does), times the int4 weight as stored."""
    packed, scale, _ = quantize_weight(weight)
    dx = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x * (1 / dx))
    return (xq.double() @ dequantize_weight(packed, scale, weight.shape[1]).double().T) * dx.double()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 16, 21])
@pytest.mark.parametrize("out_features, in_features", [(7, 200), (16, 128), (33, 896)])
def test_the_int4_kernel_computes_the_quantized_product(rows, out_features, in_features):
    """Inputs padded to 128 (200, 896) or not (128), row blocks of four (VNNI, AVX2) or sixteen
    (AMX) and a remainder, outputs a multiple of AMX's sixteen or not, every ISA path."""
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    packed, scale, corr = quantize_weight(weight)
    want = _int4_reference(x, weight)
    for kernel in _int4_kernels():
        got = kernel.linear(x, packed, scale, corr)
        assert got.shape == (rows, out_features) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # and near the float32 product: 4-bit steps of about a tenth of a random weight's spread
    exact = x @ weight.T
    assert (got - exact).norm() < 0.15 * exact.norm()


def test_an_int4_rows_result_does_not_depend_on_the_rows_beside_it():
    """Alone or among others on the VNNI and AVX2 paths; anywhere among at least
    ``AMX_MIN_ROWS`` (other rows, another place in a tile, another tile) on the AMX path."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(20, 300, generator=generator)
    packed, scale, corr = quantize_weight(torch.randn(23, 300, generator=generator))
    order = torch.randperm(20, generator=generator)
    for kernel in _int4_kernels():
        together = kernel.linear(x, packed, scale, corr)
        assert torch.equal(kernel.linear(x[order].contiguous(), packed, scale, corr), together[order])
        assert torch.equal(kernel.linear(x[3:3 + Int4Kernel.AMX_MIN_ROWS].contiguous(), packed, scale, corr),
                           together[3:3 + Int4Kernel.AMX_MIN_ROWS])
        if not kernel.amx:
            for row in range(20):
                assert torch.equal(kernel.linear(x[row:row + 1].contiguous(), packed, scale, corr)[0], together[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int4_weight_widens_to_what_it_stores(dtype):
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(10, 200, generator=generator)
    packed, scale, _ = quantize_weight(weight)
    want = dequantize_weight(packed, scale, 200)
    step = scale.repeat_interleave(64, dim=1)[:, :200]  # each weight's group's scale
    assert ((want - weight).abs() <= step + 1e-6).all()  # the nearest step, or the largest clamped to 7 steps
    for kernel in _int4_kernels():
        out = torch.empty(4, 200, dtype=dtype)
        kernel.dequantize(packed, scale, 3, 7, out)
        assert torch.equal(out, want[3:7].to(dtype))


@pytest.mark.parametrize("rows", [1, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1, 70])
@pytest.mark.parametrize("wide_dtype", [torch.float32, torch.bfloat16])
def test_int4_layers_run_few_rows_in_the_kernel_and_many_widened(rows, wide_dtype):
    """Many rows too run in the kernel where it runs them on AMX tiles."""
    kernel = _int4_kernels()[0]
    generator = torch.Generator().manual_seed(rows)
    linear = nn.Linear(200, 40)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 200, generator=generator) * 0.05)
    layer = Int4Linear(linear, kernel, wide_dtype)
    x = torch.randn(1, rows, 200, generator=generator)
    got = layer(x)
    assert got.shape == (1, rows, 40) and got.dtype == torch.float32
    quantized = dequantize_weight(layer.packed, layer.scale, 200)
    if rows <= KERNEL_MAX_ROWS or kernel.amx:
        want = _int4_reference(x[0], linear.weight.detach()).float() + linear.bias.detach()
        torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
    else:  # the stored weight itself, in float32 or bfloat16
        want = nn.functional.linear(x[0].to(wide_dtype), quantized.to(wide_dtype)).float() + linear.bias.detach()
        tolerance = 1e-5 if wide_dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got[0], want, rtol=tolerance, atol=tolerance)

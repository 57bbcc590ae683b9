"""The compiled few-row bfloat16 kernel: float32's sums, rows independent of each other, and torch's
path wherever it cannot be built."""

from __future__ import annotations

import pytest
import torch

from quickdraft import kernels
from quickdraft.kernels import bf16_rows_kernel, build


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

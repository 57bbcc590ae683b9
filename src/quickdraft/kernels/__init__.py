"""CPU kernels for what torch runs slowly here, compiled on first use with the machine's C compiler.

``bf16_rows.c``: a product of a few rows with a bfloat16 weight on an x86 CPU without bfloat16
instructions (AVX2, AVX-512 without BF16). torch's stock layer converts each weight once per row
there, so verifying six drafts cost about five one-token steps of the demo target; this kernel
reads and widens each weight once for all rows (docs/hardware.md, "Few rows of a bfloat16
weight"). Its rows do not depend on each other: a row alone and the same row among others give
the same bits.

``int4_rows.c``: a product of a few rows with a 4-bit weight (a scale per 64 inputs), for a
draft model's linear layers (``quickdraft.models.int4``): 0.56 bytes a weight against int8's 1,
and a one-token step that reads them at the memory's speed (AVX2, or AVX-512 VNNI where the CPU
has it). On the demo draft's layer shapes, 24 layers' worth of distinct weights, one row: 7.6 ms
against 18.5 for torch's dynamic int8 layers (AMX Xeon, 2 threads). Four rows and more run on
AMX int8 tiles where the CPU has them (``Int4Kernel.amx``).

``bf16_tiles.c``: a product of any number of rows with a bfloat16 weight held as AMX tiles, for a
target's linear layers on a CPU with AMX-BF16 (``quickdraft.models.packing.TiledLinear``): the
weight read once for 32 rows, where oneDNN's packed layers grew with the rows from 16 on.
``amx.h`` holds what the two AMX kernels share.

``block_rows.c``: a product of rows with a weight held in a GGUF file's own blocks (Q4_K, Q6_K,
Q4_0, Q8_0), read as the file holds them, for a quantized target (``quickdraft.models.blocks``):
each block is unpacked once for up to 16 rows, so verifying a few positions reads the weights
once (AVX2, or AVX-512 VNNI where the CPU has it).

The shared library is built once per source and compiler flags into
``~/.cache/quickdraft/kernels`` (``$QUICKDRAFT_CACHE``) with ``$CC`` (default ``cc``), about a
second, and loaded with ctypes, which releases the GIL during each call. It links OpenMP, which
resolves to the runtime torch has already loaded, so it runs on torch's threads. Where there is
no compiler, the build fails, the CPU lacks AVX2 and FMA (AMX for the tiles) or
``QUICKDRAFT_KERNELS=0`` is set, each kernel's function returns ``None`` (the reason logged once)
and callers keep torch's path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("bf16_rows.c")
INT4_SOURCE = Path(__file__).with_name("int4_rows.c")
TILES_SOURCE = Path(__file__).with_name("bf16_tiles.c")
BLOCK_SOURCE = Path(__file__).with_name("block_rows.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
# Set to 0 to keep torch's own kernels (to compare, or where a build misbehaves).
ENV = "QUICKDRAFT_KERNELS"
BUILD_TIMEOUT_S = 120

# (x [rows, in] float32, weight [out, in] bfloat16) -> [rows, out] float32
RowsLinear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kernel_dir() -> Path:
    from quickdraft.models.demo import cache_dir

    return cache_dir() / "kernels"


def _supported() -> str | None:
    """Why the kernel cannot run here, or ``None`` when it can."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    # ATen's capability honours ATEN_CPU_CAPABILITY: a run restricted below AVX2 gets no kernel.
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU runs {torch.backends.cpu.get_cpu_capability()} kernels, not AVX2"
    return None


def build(source: Path = SOURCE, directory: Path | None = None) -> Path:
    """Compile ``source`` into a shared library in ``directory`` (default ``kernel_dir()``), unless
    it is there already; its name holds a hash of the source, the compiler and the flags.

    Raises:
        RuntimeError: no compiler, or the compiler failed (its output in the message).
    """
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH (set CC)")
    # The headers beside the source count too: a changed header builds anew.
    text = source.read_bytes() + b"".join(header.read_bytes() for header in sorted(source.parent.glob("*.h")))
    digest = hashlib.sha256(text + repr((compiler, FLAGS)).encode()).hexdigest()[:16]
    directory = directory or kernel_dir()
    library = directory / f"{source.stem}-{digest}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once each get a whole file.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(source), "-o", partial], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {source.name}: {done.stderr.strip()[-800:]}")
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library


def _library(source: Path, what: str) -> ctypes.CDLL | None:
    """``source`` built and loaded, or ``None`` where it cannot run here (the reason logged once)."""
    reason = _supported()
    if reason is None:
        try:
            return ctypes.CDLL(str(build(source)))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            reason = str(error)
    log.info("%s kernel off: %s; torch's layers run instead", what, reason)
    return None


def _function(library: ctypes.CDLL, name: str, argtypes: list, restype: type | None = None) -> Callable[..., object]:
    """``library``'s C function ``name`` with its argument and result types declared."""
    function = getattr(library, name)
    function.argtypes, function.restype = argtypes, restype
    return function


@cache
def bf16_rows_kernel() -> RowsLinear | None:
    """The compiled few-row bfloat16 product, or ``None`` where it cannot run (reason logged)."""
    library = _library(SOURCE, "bfloat16 few-row")
    if library is None:
        return None
    function = _function(library, "bf16_rows_linear", [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int])

    def rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.float32 and weight.dtype == torch.bfloat16, (x.dtype, weight.dtype)
        assert x.is_contiguous() and weight.is_contiguous() and x.shape[1] == weight.shape[1]
        rows, out = x.shape[0], weight.shape[0]
        y = torch.empty(rows, out)
        function(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rows, out, x.shape[1], torch.get_num_threads())
        return y

    return rows_linear


class Int4Kernel:
    """The compiled int4 product (``int4_rows.c``, whose header gives the weight's layout).

    From ``AMX_MIN_ROWS`` rows on, where the CPU has AMX int8, the product runs on its tiles: from
    four rows on they beat the VNNI path (3x at 16 rows on the draft's shapes), and one to three
    rows stay on the VNNI path, whose single row is about twice as fast (docs/design.md).

    Attributes:
        avx512: whether it runs the AVX-512 paths (ATen is allowed AVX-512 here, which implies
            AVX-512 BW), else the AVX2 ones.
        vnni: whether the product runs the AVX-512 VNNI path (``avx512`` and the CPU has VNNI).
        amx: whether ``AMX_MIN_ROWS`` rows or more run on AMX tiles (``avx512``, AMX int8, and
            the operating system lets the process use the tiles). The product's paths sum in
            different orders: results differ in the last bits; on each path a row's result does
            not depend on the rows beside it. The widened weights are the same on every path.
    """

    GROUP = 64  # inputs per scale; the inputs are padded to a multiple of PAIR
    PAIR = 128
    AMX_MIN_ROWS = 4

    def __init__(self, library: ctypes.CDLL, avx512: bool, vnni: bool, amx: bool = False) -> None:
        self.avx512, self.vnni, self.amx = avx512, avx512 and vnni, avx512 and amx
        self._linear = _function(library, "int4_rows_linear",
                                 [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2)
        self._linear_amx = _function(library, "int4_rows_linear_amx",
                                     [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int])
        self._dequantize = _function(library, "int4_dequantize",
                                     [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 3)

    def linear(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, corr: torch.Tensor) -> torch.Tensor:
        """``x [rows, in]`` float32 times the weight ``(packed [out, padded / 2] uint8, scale
        [out, padded / GROUP], corr [out])`` -> ``[rows, out]`` float32."""
        assert x.dtype == torch.float32 and x.is_contiguous() and packed.dtype == torch.uint8, (x.dtype, packed.dtype)
        rows, out = x.shape[0], packed.shape[0]
        assert packed.shape[1] * 2 == -(-x.shape[1] // self.PAIR) * self.PAIR, (x.shape, packed.shape)
        y = torch.empty(rows, out)
        if self.amx and rows >= self.AMX_MIN_ROWS:
            self._linear_amx(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), y.data_ptr(), rows, out, x.shape[1],
                             torch.get_num_threads())
            return y
        self._linear(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), corr.data_ptr(), y.data_ptr(), rows, out,
                     x.shape[1], torch.get_num_threads(), int(self.vnni))
        return y

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows ``[start, stop)`` of the weight into ``out [stop - start, in]`` (contiguous, float32
        or bfloat16)."""
        assert out.dtype in (torch.float32, torch.bfloat16) and out.is_contiguous(), (out.dtype, out.shape)
        assert out.shape[0] == stop - start, out.shape
        self._dequantize(packed.data_ptr(), scale.data_ptr(), out.data_ptr(), start, stop, out.shape[1],
                         int(out.dtype == torch.bfloat16), int(self.avx512), torch.get_num_threads())


@cache
def int4_kernel() -> Int4Kernel | None:
    """The compiled int4 product, or ``None`` where it cannot run (reason logged)."""
    library = _library(INT4_SOURCE, "int4")
    if library is None:
        return None
    vnni, amx = (_function(library, name, [], ctypes.c_int)() for name in ("int4_has_vnni", "int4_has_amx"))
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    return Int4Kernel(library, avx512, vnni=bool(vnni), amx=bool(amx))


class Bf16Tiles:
    """The compiled bfloat16 product on AMX tiles (``bf16_tiles.c``, whose header gives the layout)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._size = _function(library, "bf16_tiles_size", [ctypes.c_int64] * 2, ctypes.c_int64)
        self._pack = _function(library, "bf16_tiles_pack", [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2)
        self._linear = _function(library, "bf16_tiles_linear",
                                 [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int])

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight [out, in]`` bfloat16 as tiles: a flat bfloat16 tensor for ``linear``."""
        assert weight.dtype == torch.bfloat16 and weight.dim() == 2, (weight.dtype, weight.shape)
        weight = weight.detach().contiguous()
        packed = torch.empty(self._size(*weight.shape), dtype=torch.bfloat16)
        self._pack(weight.data_ptr(), packed.data_ptr(), *weight.shape)
        return packed

    def linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out: int) -> torch.Tensor:
        """``x [rows, in]`` bfloat16 times the packed weight (``out`` outputs), plus ``bias``
        (``[out]`` float32 or None) -> ``[rows, out]`` bfloat16."""
        assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.dim() == 2, (x.dtype, x.shape)
        assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())
        y = torch.empty(x.shape[0], out, dtype=torch.bfloat16)
        self._linear(x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                     x.shape[0], out, x.shape[1], torch.get_num_threads())
        return y


@cache
def bf16_tiles_kernel() -> Bf16Tiles | None:
    """The compiled bfloat16 tile product, or ``None`` where it cannot run (reason logged)."""
    library = _library(TILES_SOURCE, "bfloat16 tile")
    if library is None:
        return None
    if not _function(library, "bf16_tiles_available", [], ctypes.c_int)():
        log.info("bfloat16 tile kernel off: the CPU has no AMX-BF16 tiles for this process")
        return None
    return Bf16Tiles(library)


class BlockKernel:
    """The compiled product with a GGUF file's blocks (``block_rows.c``, whose header gives the
    layouts and the arithmetic).

    Attributes:
        vnni: whether the Q4_K and Q6_K products run the AVX-512 VNNI paths (ATen is allowed
            AVX-512 here and the CPU has VNNI), else the AVX2 ones. Both sum in the same order
            per sub-block; results may differ in the last bits.
    """

    # ggml's type numbers (``gguf.GGMLQuantizationType``) this kernel runs.
    TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}

    def __init__(self, library: ctypes.CDLL, vnni: bool) -> None:
        self.vnni = vnni
        self._row_bytes = cache(_function(library, "block_row_bytes", [ctypes.c_int, ctypes.c_int64], ctypes.c_int64))
        self._linear = _function(library, "block_rows_linear", [ctypes.c_int] + [ctypes.c_void_p] * 3
                                 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2)
        self._dequantize = _function(library, "block_dequantize", [ctypes.c_int] + [ctypes.c_void_p] * 3
                                     + [ctypes.c_int64] * 2 + [ctypes.c_int])

    def row_bytes(self, kind: int, inputs: int) -> int:
        """Bytes of one row of ``inputs`` weights of type ``kind``; 0 where the kernel cannot run it
        (remembered: ``linear`` checks it on every call)."""
        return int(self._row_bytes(kind, inputs))

    def linear(self, x: torch.Tensor, blocks: torch.Tensor, kind: int) -> torch.Tensor:
        """``x [rows, in]`` float32 times the weight ``blocks [out, row_bytes(kind, in)]`` uint8
        -> ``[rows, out]`` float32."""
        assert x.dtype == torch.float32 and x.is_contiguous() and x.dim() == 2, (x.dtype, x.shape)
        assert blocks.dtype == torch.uint8 and blocks.is_contiguous(), (blocks.dtype, blocks.shape)
        assert blocks.shape[1] == self.row_bytes(kind, x.shape[1]) > 0, (kind, x.shape, blocks.shape)
        y = torch.empty(x.shape[0], blocks.shape[0])
        self._linear(kind, blocks.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], blocks.shape[0], x.shape[1],
                     torch.get_num_threads(), int(self.vnni))
        return y

    def dequantize(self, blocks: torch.Tensor, kind: int, rows: torch.Tensor, inputs: int) -> torch.Tensor:
        """Rows ``rows`` (``[n]`` int64) of the weight as float32 ``[n, inputs]``."""
        assert blocks.dtype == torch.uint8 and blocks.is_contiguous() and blocks.shape[1] == self.row_bytes(kind, inputs)
        rows = rows.to(torch.int64).contiguous()
        assert rows.dim() == 1 and (rows.numel() == 0 or (0 <= int(rows.min()) and int(rows.max()) < blocks.shape[0]))
        y = torch.empty(rows.numel(), inputs)
        self._dequantize(kind, blocks.data_ptr(), rows.data_ptr(), y.data_ptr(), rows.numel(), inputs,
                         torch.get_num_threads())
        return y


@cache
def block_kernel() -> BlockKernel | None:
    """The compiled product with GGUF blocks, or ``None`` where it cannot run (reason logged)."""
    library = _library(BLOCK_SOURCE, "GGUF block")
    if library is None:
        return None
    vnni = bool(_function(library, "block_has_vnni", [], ctypes.c_int)())
    return BlockKernel(library, vnni=vnni and torch.backends.cpu.get_cpu_capability() == "AVX512")

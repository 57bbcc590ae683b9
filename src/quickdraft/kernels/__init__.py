"""CPU kernels for what torch runs slowly here, compiled on first use with the machine's C compiler.

``bf16_rows.c``: a product of a few rows with a bfloat16 weight on an x86 CPU without bfloat16
instructions (AVX2, AVX-512 without BF16). torch's stock layer converts each weight once per row
there, so verifying six drafts cost about five one-token steps of the demo target; this kernel
reads and widens each weight once for all rows (docs/hardware.md, "Few rows of a bfloat16
weight"). Its rows do not depend on each other: a row alone and the same row among others give
the same bits.

The shared library is built once per source and compiler flags into
``~/.cache/quickdraft/kernels`` (``$QUICKDRAFT_CACHE``) with ``$CC`` (default ``cc``), about a
second, and loaded with ctypes, which releases the GIL during each call. It links OpenMP, which
resolves to the runtime torch has already loaded, so it runs on torch's threads. Where there is
no compiler, the build fails, the CPU lacks AVX2 and FMA or ``QUICKDRAFT_KERNELS=0`` is set,
``bf16_rows_kernel()`` returns ``None`` (the reason logged once) and callers keep torch's path.
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
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
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
    text = source.read_bytes()
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


@cache
def bf16_rows_kernel() -> RowsLinear | None:
    """The compiled few-row bfloat16 product, or ``None`` where it cannot run (reason logged)."""
    reason = _supported()
    if reason is None:
        try:
            library = ctypes.CDLL(str(build()))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            reason = str(error)
    if reason is not None:
        log.info("bfloat16 few-row kernel off: %s; torch's layers run instead", reason)
        return None
    function = library.bf16_rows_linear
    function.restype = None
    function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]

    def rows_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.float32 and weight.dtype == torch.bfloat16, (x.dtype, weight.dtype)
        assert x.is_contiguous() and weight.is_contiguous() and x.shape[1] == weight.shape[1]
        rows, out = x.shape[0], weight.shape[0]
        y = torch.empty(rows, out)
        function(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rows, out, x.shape[1], torch.get_num_threads())
        return y

    return rows_linear

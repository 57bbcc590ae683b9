"""Products with a weight held in a narrower format than float32, widened a block at a time.

Many rows times a bfloat16 or int4 weight run fastest on a CPU without native kernels for that
format as products in a wider format: each block of the weight's outputs is widened into a
scratch buffer and multiplied by all rows at once, in float32 by MKL (``packing.WidenedLinear``,
``int4.Int4Linear`` on most CPUs) or in bfloat16 by oneDNN (``int4.Int4Linear`` where the CPU has
bfloat16 matrix units).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

# Float32 entries converted per block: 8 MiB. Blocks of 128k entries (0.5 MiB, a core's L2)
# made each conversion and product call so short that their overhead doubled the time; at 2M
# entries 16 to 64 rows ran as fast as float32 weights.
WIDEN_BLOCK = 2**21


def widened_product(flat: torch.Tensor, out_features: int, widen: Callable[[torch.Tensor, int, int], object],
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``flat [rows, in]`` float32 times a weight ``[out_features, in]`` held in a narrower format:
    ``widen(block, start, stop)`` writes outputs ``[start, stop)`` of it in ``dtype`` into
    ``block``, a ``WIDEN_BLOCK``-sized piece of the thread's scratch buffer, and each block is
    multiplied in ``dtype`` (float32: MKL; bfloat16: oneDNN, for CPUs with bfloat16 matrix
    units). Returns ``[rows, out_features]`` float32 (a transposed view)."""
    inputs = flat.shape[1]
    rows = flat.T.to(dtype)  # [in, rows]
    out = torch.empty(out_features, flat.shape[0], dtype=dtype)  # transposed: each block's product is contiguous
    step = max(1, WIDEN_BLOCK // inputs)
    buffer = scratch(min(step, out_features) * inputs, dtype)
    for start in range(0, out_features, step):
        stop = min(start + step, out_features)
        block = buffer[: (stop - start) * inputs].view(stop - start, inputs)
        widen(block, start, stop)
        torch.mm(block, rows, out=out[start:stop])
    return out.T.float()


_scratch_local = threading.local()


def scratch(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A buffer of at least ``numel`` entries of ``dtype``, one per thread and dtype, shared by
    every ``widened_product``: one layer converts at a time, and a buffer per layer would hold 8
    MiB each."""
    buffers = _scratch_local.__dict__.setdefault("buffers", {})
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < numel:
        # A normal tensor even when first asked for in inference mode (the probe): an inference
        # tensor refuses the in-place copies of a forward outside it.
        with torch.inference_mode(False):
            buffer = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buffer

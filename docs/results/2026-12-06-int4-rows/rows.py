"""The int4 kernel (``quickdraft.kernels.int4_kernel``) on the demo draft's layer shapes, 24
layers' worth (q/k/v fused 896 -> 1152, o 896 -> 896, gate/up fused 896 -> 9728, down 4864 -> 896;
random weights), for 1 to 16 rows: the product alone, no decoder around it. Median of 7.

Usage: PYTHONPATH=SRC python rows.py
"""

from __future__ import annotations

import statistics
import time

import torch

from quickdraft.kernels import int4_kernel
from quickdraft.models.int4 import quantize_weight

SHAPES = [(896, 1152), (896, 896), (896, 9728), (4864, 896)]  # (inputs, outputs)
LAYERS = 24


def main() -> None:
    torch.set_num_threads(2)
    kernel = int4_kernel()
    assert kernel is not None, "the int4 kernel does not run here"
    generator = torch.Generator().manual_seed(0)
    weights = [quantize_weight(torch.randn(out, inputs, generator=generator) * 0.05) for inputs, out in SHAPES]
    print(f"kernel: {'AVX-512 VNNI' if kernel.vnni else 'AVX-512' if kernel.avx512 else 'AVX2'}, 2 threads")
    print("| rows | ms for 24 layers | per row | over one row |")
    print("| ---: | ---: | ---: | ---: |")
    one = None
    for rows in (1, 2, 4, 6, 8, 16):
        xs = [torch.randn(rows, inputs, generator=generator) for inputs, _ in SHAPES]
        times = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(LAYERS):
                for x, (packed, scale, corr) in zip(xs, weights):
                    kernel.linear(x, packed, scale, corr)
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
        one = one or ms
        print(f"| {rows} | {ms:.1f} | {ms / rows:.1f} | {ms / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()

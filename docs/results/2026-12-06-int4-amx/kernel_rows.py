"""The int4 kernel's paths by rows on the demo draft's layer shapes, 24 layers' worth (q/k/v fused
896 -> 1152, o 896 -> 896, gate/up fused 896 -> 9728, down 4864 -> 896; random weights, the same
four 24 times: about 8 MB, which the caches hold, so few rows run faster here than in a forward
that reads each layer's weights from memory): the
machine's kernel (AMX tiles from ``Int4Kernel.AMX_MIN_ROWS`` rows where the CPU has them), its
VNNI path, and the widened bfloat16 product ``Int4Linear`` ran beyond 16 rows before. Median of 5.

Usage: PYTHONPATH=SRC python kernel_rows.py
"""

from __future__ import annotations

import ctypes
import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.kernels import Int4Kernel, build, int4_kernel
from quickdraft.models.int4 import Int4Linear

SHAPES = [(896, 1152), (896, 896), (896, 9728), (4864, 896)]  # (inputs, outputs)
LAYERS = 24


def main() -> None:
    torch.set_num_threads(2)
    kernel = int4_kernel()
    assert kernel is not None and kernel.amx, "no AMX tiles for the int4 kernel here"
    vnni = Int4Kernel(ctypes.CDLL(str(build(kernels.INT4_SOURCE))), avx512=True, vnni=kernel.vnni)
    generator = torch.Generator().manual_seed(0)
    layers = [Int4Linear(torch.nn.Linear(inputs, out), kernel, torch.bfloat16) for inputs, out in SHAPES]
    paths = {"machine (AMX)": lambda layer, x: kernel.linear(x, layer.packed, layer.scale, layer.corr),
             "VNNI": lambda layer, x: vnni.linear(x, layer.packed, layer.scale, layer.corr),
             "widened bfloat16": lambda layer, x: layer._widened(x)}
    print(f"ms for {LAYERS} layers, 2 threads")
    print("| rows | " + " | ".join(paths) + " |")
    print("| ---: |" + " ---: |" * len(paths))
    for rows in (1, 2, 3, 4, 8, 16, 32, 64, 256, 512):
        xs = [torch.randn(rows, inputs, generator=generator) for inputs, _ in SHAPES]
        cells = []
        for name, path in paths.items():
            if name == "widened bfloat16" and rows < 16:
                cells.append("-")
                continue
            times = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(LAYERS):
                    for layer, x in zip(layers, xs):
                        path(layer, x)
                times.append(time.perf_counter() - start)
            cells.append(f"{statistics.median(times) * 1e3:.1f}")
        print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""The demo 1.5B target's linear layers, 28 layers of distinct random weights (so that they are read
from memory, as in a forward), in bfloat16: the AMX tile kernel (``TiledLinear``) against oneDNN
on its packed layout (``PackedLinear``), 1 to 512 rows; interleaved, median of 5, ms for 28 layers.

Usage: PYTHONPATH=SRC python layer_rows.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from quickdraft.models.packing import PackedLinear, TiledLinear

SHAPES = [(1536, 1536), (1536, 256), (1536, 256), (1536, 1536), (1536, 8960), (1536, 8960), (8960, 1536)]  # (in, out)
LAYERS = 28


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    stock = [nn.Linear(i, o, bias=False).to(torch.bfloat16) for _ in range(LAYERS) for i, o in SHAPES]
    kinds = {"tiles": [TiledLinear(layer) for layer in stock], "oneDNN packed": [PackedLinear(layer) for layer in stock]}
    del stock
    print(f"ms for {LAYERS} layers, 2 threads")
    print("| rows | " + " | ".join(kinds) + " | tiles / oneDNN |")
    print("| ---: |" + " ---: |" * (len(kinds) + 1))
    with torch.inference_mode():
        for rows in (1, 4, 6, 16, 32, 48, 64, 128, 512):
            xs = {i: torch.randn(rows, i).to(torch.bfloat16) for i, _ in SHAPES}
            times: dict[str, list[float]] = {name: [] for name in kinds}
            for repeat in range(5):
                for name in (kinds if repeat % 2 == 0 else reversed(list(kinds))):
                    start = time.perf_counter()
                    for layer in kinds[name]:
                        layer(xs[layer.in_features])
                    times[name].append(time.perf_counter() - start)
            ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            print(f"| {rows} | {ms['tiles']:.1f} | {ms['oneDNN packed']:.1f} | {ms['tiles'] / ms['oneDNN packed']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()

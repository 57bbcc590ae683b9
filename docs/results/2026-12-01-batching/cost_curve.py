"""The target's forward cost over (rows x positions) on this machine: what batching and drafts
buy. Each row holds a 48-token context; median of 7 timed forwards after 2 warm-ups, in
milliseconds and relative to one row x one position.

Usage: python cost_curve.py [MODEL [DTYPE [stock]]] (default: smollm2-135m-instruct in bfloat16;
"stock": transformers' own linear layers, not the packed or widened ones ``load_model`` picks).
"""

import statistics
import sys
import time

import torch

from quickdraft import load_model
from quickdraft.batch.runner import BatchRunner

CONTEXT = 48
SHAPES = [(1, 1), (1, 6), (1, 16), (4, 1), (4, 6), (16, 1), (16, 6), (32, 1), (32, 6)]  # (rows, positions)

name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
stock = len(sys.argv) > 3 and sys.argv[3] == "stock"
model = load_model(name, dtype=dtype, pack_weights=False if stock else None)
runner = BatchRunner(model)
for row in range(32):
    runner.add_row()
    runner.forward(row, [list(range(100, 100 + CONTEXT))], [0])
times = {}
for rows, positions in SHAPES:
    samples = []
    for repeat in range(9):
        for row in range(rows):
            runner.truncate(row, CONTEXT)
        start = time.perf_counter()
        runner.forward(0, [[7] * positions] * rows, [positions] * rows)
        samples.append(time.perf_counter() - start)
    times[rows, positions] = statistics.median(samples[2:])
base = times[1, 1]
print("| rows x positions | ms | relative to 1 x 1 |")
print("| --- | ---: | ---: |")
for (rows, positions), seconds in times.items():
    print(f"| {rows} x {positions} | {1000 * seconds:.1f} | {seconds / base:.2f} |")
print(f"\n{name}, {model.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads")

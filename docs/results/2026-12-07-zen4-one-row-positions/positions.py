"""A target forward over one row's P positions (P = 1 .. 16, logits for each), the demo target as
`quickdraft serve` loads it on this machine, the row holding 41 tokens; ROUNDS interleaved rounds
over the P values, the fastest and the median of each.

Usage (from this folder): PYTHONPATH=SRC python positions.py [ROUNDS]
"""
import statistics
import sys
import time

import torch
from quickdraft.batch.runner import BatchRunner
from quickdraft.models.loading import load_model

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
POSITIONS = (1, 2, 3, 4, 5, 6, 8, 16)
torch.set_num_threads(2)
target = load_model("qwen2.5-coder-1.5b-instruct")
print(f"target {target.precision}; {torch.get_num_threads()} threads")
runner = BatchRunner(target)
runner.add_row()
seconds = {p: [] for p in POSITIONS}
with torch.inference_mode():
    runner.forward(0, [[1] * 41], [1])
    for round_ in range(ROUNDS):
        for p in POSITIONS if round_ % 2 == 0 else POSITIONS[::-1]:
            start = time.perf_counter()
            logits = runner.forward(0, [[5] * p], [p])
            float(logits[0][0, 0])
            seconds[p].append(time.perf_counter() - start)
            runner.truncate(0, 41)
print("| positions | fastest (s) | median (s) | median over one position's |")
print("| ---: | ---: | ---: | ---: |")
one = statistics.median(seconds[1])
for p, took in seconds.items():
    print(f"| {p} | {min(took):.3f} | {statistics.median(took):.3f} | {statistics.median(took) / one:.2f} |")

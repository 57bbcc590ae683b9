"""Batched forwards of the demo pair as `quickdraft serve` loads them, each row a 64-token context:
the target over ROWS rows x 1..4 positions and one row, the draft (full output layer) over ROWS x 1,
ROWS x 2 and one row; 8 interleaved rounds, median of the last 7, relative to the target over ROWS x 1.

Usage (from this folder): PYTHONPATH=SRC python batch_costs.py [ROWS [vnni]] ("vnni": the int4 draft's
product on its VNNI path at every row count, as before the AMX path)
"""
import sys, time, statistics
sys.path.insert(0, "../2026-12-05-batching-waves")
import torch
from demo_setup import load_demo
from quickdraft.batch.runner import BatchRunner
from quickdraft.kernels import Int4Kernel
if sys.argv[2:] == ["vnni"]:
    Int4Kernel.AMX_MIN_ROWS = 10**9
target, draft, ids = load_demo()
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 16
CTX = 64
runners = {"target": BatchRunner(target), "draft": BatchRunner(draft)}
for r in runners.values():
    for row in range(ROWS):
        r.add_row(); r.forward(row, [list(range(100, 100 + CTX))], [0])
shapes = [("target", ROWS, p) for p in (1, 2, 3, 4)] + [("target", 1, 1), ("draft", ROWS, 1), ("draft", 1, 1), ("draft", ROWS, 2)]
samples = {s: [] for s in shapes}
for rep in range(8):
    for s in (shapes if rep % 2 == 0 else shapes[::-1]):
        name, rows, pos = s
        r = runners[name]
        for row in range(rows): r.truncate(row, CTX)
        t = time.perf_counter(); r.forward(0, [[7] * pos] * rows, [pos] * rows); samples[s].append(time.perf_counter() - t)
base = statistics.median(samples[("target", ROWS, 1)][1:])
for s, v in samples.items():
    m = statistics.median(v[1:])
    print(f"{s[0]:6s} {s[1]:3d} x {s[2]}  {1000*m:7.1f} ms  / target {ROWS}x1 {m/base:.2f}")

"""Batched forwards of the demo pair as `quickdraft serve` loads it and its batched engine runs
them, each row a 64-token context: the target over ROWS rows x 1..4 positions and over one row;
the draft over ROWS x 1, ROWS x 2 and one row with the engine's output layer (its draft
vocabulary, ``BatchOutputRows``). 8 interleaved rounds, median of the last 7, relative to the
target over ROWS x 1. (../2026-12-06-int4-amx/batch_costs.py is the same with the draft's full
output layer.)

Usage (from this folder): PYTHONPATH=SRC python batch_costs.py [ROWS]
"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import load_demo  # noqa: E402
from quickdraft.batch.runner import BatchRunner  # noqa: E402
from quickdraft.drafters.registry import draft_vocabulary_size  # noqa: E402
from quickdraft.drafters.vocabulary import BatchOutputRows  # noqa: E402

target, draft, ids = load_demo()
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 16
CTX = 64
vocabulary = BatchOutputRows(draft, draft_vocabulary_size(draft))
no_rows = torch.empty(0, dtype=torch.long)
heads = {"target": None, "draft": lambda hidden, rows: vocabulary.logits(hidden, [no_rows] * len(rows))}
runners = {"target": BatchRunner(target), "draft": BatchRunner(draft)}
for r in runners.values():
    for row in range(ROWS):
        r.add_row()
        r.forward(row, [list(range(100, 100 + CTX))], [0])
shapes = [("target", ROWS, p) for p in (1, 2, 3, 4)] + [("target", 1, 1), ("draft", ROWS, 1), ("draft", 1, 1),
                                                        ("draft", ROWS, 2)]
samples = {s: [] for s in shapes}
for rep in range(8):
    for s in (shapes if rep % 2 == 0 else shapes[::-1]):
        name, rows, pos = s
        r = runners[name]
        for row in range(rows):
            r.truncate(row, CTX)
        start = time.perf_counter()
        r.forward(0, [[7] * pos] * rows, [pos] * rows, heads[name])
        samples[s].append(time.perf_counter() - start)
base = statistics.median(samples[("target", ROWS, 1)][1:])
for s, v in samples.items():
    m = statistics.median(v[1:])
    print(f"{s[0]:6s} {s[1]:3d} x {s[2]}  {1000 * m:7.1f} ms  / target {ROWS}x1 {m / base:.2f}")

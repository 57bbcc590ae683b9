"""What a forward costs at start-up (one token a row in empty caches, as ``BatchEngine._time_forwards``
times it) against the same forward with each row's context in the cache: the demo pair as `quickdraft
serve` loads it, 2 threads, 32 rows filled to CONTEXT tokens, then forwards over ROWS rows of WIDTH
positions each: the median of REPEATS forwards at each context, the two contexts taken in turn
(the host's load drifts), the cache cut back after each.

Usage (from this folder): PYTHONPATH=SRC python contexts.py [CONTEXT [REPEATS]]
"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "../2026-12-05-batching-waves")
from demo_setup import load_demo  # noqa: E402
from quickdraft.batch.runner import BatchRunner  # noqa: E402

CONTEXT = int(sys.argv[1]) if len(sys.argv) > 1 else 250
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
SHAPES = ((1, 1), (4, 1), (16, 1), (16, 2), (32, 1), (32, 2), (32, 3))  # (rows, width)
target, draft, _ = load_demo()


def filled(model, context: int) -> BatchRunner:
    """32 rows holding ``context`` tokens each, warmed up by one forward over all of them."""
    runner = BatchRunner(model)
    for _ in range(32):
        runner.add_row()
    for first in range(0, 32, 4):
        runner.forward(first, [[13] * context] * 4, [1] * 4)
    runner.forward(0, [[11]] * 32, [1] * 32)
    for row in range(32):
        runner.truncate(row, context)
    return runner


def once(runner: BatchRunner, context: int, rows: int, width: int) -> float:
    start = time.perf_counter()
    runner.forward(0, [[11] * width] * rows, [width] * rows)
    elapsed = time.perf_counter() - start
    for row in range(rows):
        runner.truncate(row, context)
    return elapsed


with torch.inference_mode():
    print("| model | rows | positions a row | seconds, context 1 | seconds, context %d | difference | ratio |" % CONTEXT)
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, model in (("target", target), ("draft", draft)):
        runners = {context: filled(model, context) for context in (1, CONTEXT)}
        for rows, width in SHAPES:
            times = {context: [] for context in runners}
            for _ in range(REPEATS):
                for context, runner in runners.items():
                    times[context].append(once(runner, context, rows, width))
            empty, full = (statistics.median(times[c]) for c in (1, CONTEXT))
            print(f"| {name} | {rows} | {width} | {empty:.3f} | {full:.3f} | {full - empty:+.3f} | {full / empty:.2f} |",
                  flush=True)

"""How precisely the paired ratios pin speculation on / off down: for each level, the pairs'
geometric mean and median with 95% intervals (percentile bootstrap, 20,000 resamples, seed 0).

Inputs: run.sh folders (waves paired by repeat, ../2026-12-06-zen4-waves-held/pooled.py), or
continuous_k.py outputs (a file: the goodput engine's "vs none" ratios, paired by round).

Usage: python interval.py RUNS_OR_FILE [RUNS_OR_FILE ...]
"""
import math
import os
import random
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, "../2026-12-06-zen4-waves-held")
from pooled import paired_ratios  # noqa: E402

RESAMPLES = 20_000


def engine_ratios(path: str) -> dict[int, list[float]]:
    """The goodput engine's ratios to no draft, by round, of a continuous_k.py output whose name
    ends in _CLIENTS.txt."""
    clients = int(re.search(r"_(\d+)\.txt$", path).group(1))
    for line in open(path):
        if line.startswith("goodput"):
            listed = re.search(r"vs none \[([^\]]*)\]", line).group(1)
            return {clients: [float(x) for x in listed.split(",")]}
    raise SystemExit(f"{path}: no goodput line")


def geometric_mean(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def interval(ratios: list[float], statistic, rng: random.Random) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ``statistic`` over resamples of ``ratios``."""
    values = sorted(statistic(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    return values[int(0.025 * RESAMPLES)], values[int(0.975 * RESAMPLES) - 1]


by_level = defaultdict(list)
for source in sys.argv[1:]:
    found = paired_ratios([source]) if os.path.isdir(source) else engine_ratios(source)
    for clients, ratios in found.items():
        by_level[clients].extend(ratios)
print("| clients | pairs | geometric mean (95% interval) | median (95% interval) |")
print("| ---: | ---: | --- | --- |")
for clients, ratios in sorted(by_level.items()):
    rng = random.Random(0)
    low, high = interval(ratios, geometric_mean, rng)
    mlow, mhigh = interval(ratios, statistics.median, rng)
    print(f"| {clients} | {len(ratios)} | {geometric_mean(ratios):.3f}x ({low:.3f}-{high:.3f}) | "
          f"{statistics.median(ratios):.3f}x ({mlow:.3f}-{mhigh:.3f}) |")

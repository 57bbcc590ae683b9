"""Speculation on / off over the pairs of several run.sh folders together (each folder's waves
paired by repeat, as ../2026-12-01-batching/summarize.py pairs them): median, geometric mean and
each pair, by level.

Usage: python pooled.py RUNS [RUNS ...]
"""
import glob
import json
import math
import statistics
import sys
from collections import defaultdict


def paired_ratios(folders: list[str]) -> dict[int, list[float]]:
    """Speculation on / off tokens/s of each pair of waves in ``folders``, by clients."""
    rates = defaultdict(dict)  # (folder, clients, repeat) -> config -> tok/s
    for runs in folders:
        for path in glob.glob(f"{runs}/batch-*-c*-r*.json"):
            name = path.split("/")[-1][:-len(".json")]
            config, rest = name.rsplit("-c", 1)
            clients, repeat = rest.split("-r")
            for level in json.load(open(path))["levels"]:
                rates[runs, int(clients), int(repeat)][config] = level["level"]["tok_per_s"]
    by_level = defaultdict(list)
    for (_, clients, _), pair in rates.items():
        if {"batch-draft", "batch-none"} <= pair.keys():
            by_level[clients].append(pair["batch-draft"] / pair["batch-none"])
    return by_level


if __name__ == "__main__":
    print("| clients | pairs | median | geometric mean | each pair (sorted) |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for clients, ratios in sorted(paired_ratios(sys.argv[1:]).items()):
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        print(f"| {clients} | {len(ratios)} | **{statistics.median(ratios):.2f}x** | {mean:.2f}x | "
              + ", ".join(f"{r:.2f}" for r in sorted(ratios)) + " |")

"""The default against plain decoding, paired run by run (same phase, category and repeat), from
bench results.json files: the prefill's time, each run's median one-position target forward (its
plain steps; results.json ``forwards``), and tokens/s of decoding alone (seconds minus prefill) by
category, with the mean of the six Spec-Bench categories (code left out).

Usage: python paired.py RESULTS.json [RESULTS.json ...]"""
import json
import statistics
import sys
from collections import defaultdict


def one_position_median(run: dict) -> float | None:
    """Median seconds of the run's one-position target forwards after the prefill (None: none)."""
    one = [seconds for positions, seconds in run["forwards"]["target"][1:] if positions == 1]
    return statistics.median(one) if one else None


def summarize(ratios: list[float]) -> str:
    return f"median {statistics.median(ratios):.3f} over {len(ratios)} pairs, {sum(r > 1 for r in ratios)} above 1"


pairs = defaultdict(dict)  # (file, phase, category, repeat) -> method -> run
for path in sys.argv[1:]:
    for run in json.load(open(path))["runs"]:
        pairs[path, run["phase"], run["category"], run["repeat"]][run["method"]] = run
pairs = {key: m for key, m in pairs.items() if {"default", "plain"} <= m.keys()}

prefill = [m["default"]["stats"]["time_prefill"] / m["plain"]["stats"]["time_prefill"] for m in pairs.values()]
print("prefill, default / plain:", summarize(prefill), f"(range {min(prefill):.2f}-{max(prefill):.2f})")
steps = {}  # (file, phase, category, repeat) -> default / plain
for key, m in sorted(pairs.items()):
    default, plain = one_position_median(m["default"]), one_position_median(m["plain"])
    if default is not None and plain is not None:
        steps[key] = default / plain
print("one-position step, default / plain:", summarize(list(steps.values())))
print("  each:", ", ".join(f"{path.split('/')[0]} {phase[:4]} {category} {repeat} {r:.2f}"
                          for (path, phase, category, repeat), r in steps.items()))

decoding = defaultdict(lambda: defaultdict(list))  # phase -> category -> plain / default decoding time
for (_, phase, category, _), m in pairs.items():
    decoding[phase][category].append((m["plain"]["seconds"] - m["plain"]["stats"]["time_prefill"])
                                     / (m["default"]["seconds"] - m["default"]["stats"]["time_prefill"]))
for phase, categories in decoding.items():
    medians = {c: statistics.median(v) for c, v in categories.items()}
    prose = [v for c, v in medians.items() if c != "code"]
    print(f"decoding alone, default / plain, {phase}:", ", ".join(f"{c} {v:.2f}" for c, v in medians.items()),
          f"| mean of the six Spec-Bench categories {sum(prose) / len(prose):.2f}")

"""The generations of a bench run that decoded most of their steps plainly, per category.

Usage: python plain_runs.py RESULTS_JSON [MIN_STEPS]

For each category at T = 0, the default method's generations with at least MIN_STEPS (default
50) of their steps for 64 tokens (a generation that drafts little needs nearly one step a
token), with their speedup over the plain run of the same prompt, and all the generations'
tokens per step.
"""

import collections
import json
import statistics
import sys


def main(path: str, min_steps: int) -> None:
    data = json.load(open(path, encoding="utf-8"))
    runs = [r for r in data["runs"] if r["temperature"] == 0]
    plain = {r["prompt_id"]: r["tokens_per_second"] for r in runs if r["method"] == "plain"}
    by_category = collections.defaultdict(list)
    for run in runs:
        if run["method"] == "default":
            by_category[run["category"]].append(run)
    total = 0
    for category, generations in by_category.items():
        slow = [g for g in generations if g["stats"]["steps"] >= min_steps]
        total += len(slow)
        per_step = statistics.mean(g["new_tokens"] / g["stats"]["steps"] for g in generations)
        listed = ", ".join(f"{g['prompt_id']} {g['stats']['steps']} steps "
                           f"{g['tokens_per_second'] / plain[g['prompt_id']]:.2f}x" for g in slow)
        print(f"{category:15s} tokens a step {per_step:.2f}; {len(slow)} of {len(generations)} "
              f"with >= {min_steps} steps{': ' + listed if listed else ''}")
    print(f"all: {total} generations with >= {min_steps} steps")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50)

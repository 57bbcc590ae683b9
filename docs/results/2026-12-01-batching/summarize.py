"""Medians over the repeats in RUNS/*.json (default: runs), as the markdown table of a report.

Usage: python summarize.py [RUNS]. Files are named CONFIG-cCLIENTS-rREPEAT.json (run.sh); the
configurations appear in the order of CONFIGS, then any others by name.
"""

import glob
import json
import statistics
import sys
from collections import defaultdict

CONFIGS = {"batch-ngram": "batch + ngram (goodput k)", "batch-none": "batch, no speculation",
           "sequential-ngram": "one at a time + ngram", "batch-draft": "batch + draft model (goodput k)",
           "sequential-draft": "one at a time + draft model"}
FIELDS = ("tok_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tokens_per_step")

runs = sys.argv[1] if len(sys.argv) > 1 else "runs"
levels = defaultdict(list)  # (config, clients) -> level rows of every repeat
for path in sorted(glob.glob(f"{runs}/*.json")):
    config = path.split("/")[-1].rsplit("-c", 1)[0]  # CONFIG-cCLIENTS-rREPEAT.json
    for level in json.load(open(path))["levels"]:
        levels[config, level["level"]["concurrency"]].append(level["level"])

configs = sorted({config for config, _ in levels}, key=lambda c: (list(CONFIGS).index(c) if c in CONFIGS else 99, c))
print("| run | clients | repeats | ok / 429 / failed | tok/s (each repeat) | TTFT p50 / p99 (s) | ITL p50 / p99 (s) | tokens per step |")
print("| --- | ---: | ---: | --- | --- | --- | --- | ---: |")
for config in configs:
    for clients in sorted(c for name, c in levels if name == config):
        rows = levels[config, clients]
        median = {f: statistics.median(r[f] for r in rows) for f in FIELDS}
        counts = "/".join(str(sum(r[k] for r in rows)) for k in ("ok", "rejected_429", "failed"))
        each = ", ".join(f"{r['tok_per_s']:.1f}" for r in rows)
        print(f"| {CONFIGS.get(config, config)} | {clients} | {len(rows)} | {counts} | **{median['tok_per_s']:.1f}** ({each}) "
              f"| {median['ttft_p50']:.2f} / {median['ttft_p99']:.2f} | {median['itl_p50']:.3f} / {median['itl_p99']:.3f} "
              f"| {median['tokens_per_step']:.2f} |")

# Speculation on vs off, paired by repeat: the two servers of one repeat ran back to back.
tok_per_s = {}  # (config, clients, repeat file) -> aggregate tokens/s
tpot = {}  # (config, clients, repeat file) -> seconds per token after each request's first
for path in glob.glob(f"{runs}/*.json"):
    config, rest = path.split("/")[-1].rsplit("-c", 1)
    clients, repeat = rest.removesuffix(".json").split("-r")
    for level in json.load(open(path))["levels"]:
        key = config, int(clients), repeat
        tok_per_s[key] = level["level"]["tok_per_s"]
        ok = [r for r in level["results"] if r["status"] == 200 and r["ttft"] is not None]
        tpot[key] = sum(r["total"] - r["ttft"] for r in ok) / sum(r["completion_tokens"] - 1 for r in ok)
for spec in ("batch-draft", "batch-ngram"):
    for what, values, faster in (("tokens/s", tok_per_s, lambda on, off: on / off),
                                 ("decoding speed after the first token, 1 / TPOT", tpot, lambda on, off: off / on)):
        pairs = defaultdict(list)  # clients -> ratio of each repeat
        for (config, clients, repeat), value in values.items():
            if config == spec and ("batch-none", clients, repeat) in values:
                pairs[clients].append(faster(value, values["batch-none", clients, repeat]))
        if pairs:
            print(f"\n{CONFIGS[spec]} / batch, no speculation ({what}, paired by repeat):\n")
            # The geometric mean: with the order alternated, the order's effect on a ratio cancels out.
            print("| clients | median | geometric mean | each repeat (sorted) |\n| ---: | ---: | ---: | --- |")
            for clients in sorted(pairs):
                ratios = sorted(pairs[clients])
                print(f"| {clients} | **{statistics.median(ratios):.2f}x** | {statistics.geometric_mean(ratios):.2f}x "
                      f"| {', '.join(f'{r:.2f}' for r in ratios)} |")

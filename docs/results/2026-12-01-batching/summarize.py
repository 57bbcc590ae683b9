"""Medians over the repeats in runs/*.json, as the markdown table of report.md."""

import glob
import json
import statistics
from collections import defaultdict

CONFIGS = {"batch-ngram": "batch + ngram (goodput k)", "batch-none": "batch, no speculation",
           "sequential-ngram": "one at a time + ngram"}
FIELDS = ("tok_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tokens_per_step")

levels = defaultdict(list)  # (config, clients) -> level rows of every repeat
for path in sorted(glob.glob("runs/*.json")):
    config = path.split("/")[-1].rsplit("-c", 1)[0]  # runs/CONFIG-cCLIENTS-rREPEAT.json
    for level in json.load(open(path))["levels"]:
        levels[config, level["level"]["concurrency"]].append(level["level"])

print("| run | clients | repeats | ok / 429 / failed | tok/s (each repeat) | TTFT p50 / p99 (s) | ITL p50 / p99 (s) | tokens per step |")
print("| --- | ---: | ---: | --- | --- | --- | --- | ---: |")
for config, name in CONFIGS.items():
    for clients in (1, 4, 16, 32):
        rows = levels.get((config, clients))
        if not rows:
            continue
        median = {f: statistics.median(r[f] for r in rows) for f in FIELDS}
        counts = "/".join(str(sum(r[k] for r in rows)) for k in ("ok", "rejected_429", "failed"))
        each = ", ".join(f"{r['tok_per_s']:.1f}" for r in rows)
        print(f"| {name} | {clients} | {len(rows)} | {counts} | **{median['tok_per_s']:.1f}** ({each}) "
              f"| {median['ttft_p50']:.2f} / {median['ttft_p99']:.2f} | {median['itl_p50']:.3f} / {median['itl_p99']:.3f} "
              f"| {median['tokens_per_step']:.2f} |")

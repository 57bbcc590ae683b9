"""Where each server's batched steps spent their time: the /metrics scrape run.sh saves at the end
of a run (warm-up waves included), `quickdraft_batch_step_seconds_total{phase, drafted}` and
`quickdraft_batch_steps_total{k}`. Usage: python phases.py RUNS [RUNS ...]"""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from quickdraft.batch.engine import PHASES


def read(path: Path) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """(seconds by (phase, drafted), steps by k) from one scrape."""
    seconds: dict[tuple[str, str], float] = {}
    steps: dict[str, float] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if sample.name == "quickdraft_batch_step_seconds_total":
                seconds[sample.labels["phase"], sample.labels["drafted"]] = sample.value
            elif sample.name == "quickdraft_batch_steps_total":
                steps[sample.labels["k"]] = sample.value
    return seconds, steps


def main(folders: list[str]) -> None:
    print("| run | server | steps (drafted) | seconds, steps without drafts: " + " / ".join(PHASES)
          + " | seconds, steps that drafted: " + " / ".join(PHASES) + " | drafted share of the time |")
    print("| --- | --- | ---: | --- | --- | ---: |")
    for folder in folders:
        for server in ("batch-none", "batch-draft"):
            path = Path(folder) / f"{server}.metrics"
            if not path.exists():
                continue
            seconds, steps = read(path)
            total = sum(steps.values())
            drafted_steps = total - steps.get("0", 0.0)
            plain = [seconds.get((p, "false"), 0.0) for p in PHASES]
            drafted = [seconds.get((p, "true"), 0.0) for p in PHASES]
            share = sum(drafted) / max(sum(plain) + sum(drafted), 1e-9)
            print(f"| {folder} | {server} | {total:.0f} ({drafted_steps:.0f}) | "
                  + " / ".join(f"{s:.1f}" for s in plain) + " | " + " / ".join(f"{s:.1f}" for s in drafted)
                  + f" | {share:.1%} |")


if __name__ == "__main__":
    main(sys.argv[1:])

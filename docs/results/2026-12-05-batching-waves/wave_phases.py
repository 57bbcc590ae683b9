"""Where each server's batched steps spent their time, wave by wave: the /metrics scrapes run.sh
saves after each wave (RUNS/metrics/NNN-SERVER-cCLIENTS-rREPEAT.metrics, numbered in the order the
waves ran), each less the same process's scrape before it (with run.sh's ONE_SERVER=1 both
names are one server, told apart by the process id its .stat files hold). By concurrency level
(warm-up waves left out), per server: steps and how many drafted, rows a step, the mean seconds
of a step that did not draft and of one that did, and the share of the time drafted steps took;
the draft server's running acceptance and realized gain as its last wave of the level left them. With `waves`, a line per
wave instead: steps, steps that drafted, and seconds of the steps that drafted by phase.
Usage: python wave_phases.py RUNS [waves]"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from quickdraft.batch.engine import PHASES

NAME = re.compile(r"\d+-(?P<server>batch-\w+)-c(?P<clients>\d+)-(?P<wave>warmup|r\d+)\.metrics")


def read(path: Path) -> dict[str, float]:
    """The counters and gauges wave_phases reads, flat: 'seconds/PHASE/DRAFTED', 'steps/K',
    'row_steps', 'acceptance/SOURCE', 'gain'."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if sample.name == "quickdraft_batch_step_seconds_total":
                values[f"seconds/{sample.labels['phase']}/{sample.labels['drafted']}"] = sample.value
            elif sample.name == "quickdraft_batch_steps_total":
                values[f"steps/{sample.labels['k']}"] = sample.value
            elif sample.name == "quickdraft_batch_drafted_tokens_per_row_count":
                values["row_steps"] = sample.value
            elif sample.name == "quickdraft_batch_acceptance":
                values[f"acceptance/{sample.labels['source']}"] = sample.value
            elif sample.name == "quickdraft_batch_realized_gain":
                values["gain"] = sample.value
    return values


def read_stat(path: Path) -> dict[str, float]:
    """The process id, minor page faults and user / system CPU seconds from a saved /proc/PID/stat
    ('pid', 'faults', 'user', 'system'); nothing where run.sh saved none."""
    text = path.read_text() if path.exists() else ""
    if not text:
        return {}
    fields = text.rsplit(")", 1)[1].split()  # fields 3.. of proc(5), past the command name
    ticks = os.sysconf("SC_CLK_TCK")
    return {"pid": float(text.split()[0]), "faults": float(fields[7]), "user": int(fields[11]) / ticks,
            "system": int(fields[12]) / ticks}


def main(folder: str, each_wave: bool = False) -> None:
    previous: dict[str | float, dict[str, float]] = defaultdict(dict)  # by process
    totals: dict[tuple[int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    last: dict[tuple[int, str], dict[str, float]] = {}
    for path in sorted(Path(folder, "metrics").glob("*.metrics")):
        match = NAME.fullmatch(path.name)
        if not match:
            continue
        server, clients = match["server"], int(match["clients"])
        now = read(path) | read_stat(path.with_suffix(".stat"))
        process = now.get("pid", server)
        if each_wave:
            wave = {key: value - previous[process].get(key, 0.0) for key, value in now.items()
                    if key.startswith(("seconds/", "steps/"))}
            steps = sum(v for k, v in wave.items() if k.startswith("steps/"))
            drafted = " / ".join(f"{wave.get(f'seconds/{phase}/true', 0.0):.3f}" for phase in PHASES)
            print(f"{path.stem}: {steps:.0f} steps, {steps - wave.get('steps/0', 0.0):.0f} drafted; "
                  f"drafted steps' seconds, {' / '.join(PHASES)}: {drafted}")
        if match["wave"] != "warmup":
            for key, value in now.items():
                if key.startswith(("seconds/", "steps/", "row_steps", "faults", "user", "system")):
                    totals[clients, server][key] += value - previous[process].get(key, 0.0)
            last[clients, server] = now
        previous[process] = now
    if each_wave:
        return
    print("| clients | server | steps (drafted) | rows a step | seconds a step, not drafted / drafted "
          "| not drafted: prefill / draft / verify / accept a step | minor page faults a step | CPU seconds a step, user / system | drafted share of the time | acceptance (model) at the end | realized gain at the end |")
    print("| ---: | --- | ---: | ---: | --- | --- | ---: | --- | ---: | ---: | ---: |")
    for (clients, server), total in sorted(totals.items()):
        steps = sum(v for k, v in total.items() if k.startswith("steps/"))
        plain_steps = total.get("steps/0", 0.0)
        plain = sum(v for k, v in total.items() if k.startswith("seconds/") and k.endswith("/false"))
        drafted = sum(v for k, v in total.items() if k.startswith("seconds/") and k.endswith("/true"))
        per = [f"{plain / plain_steps:.3f}" if plain_steps else "-",
               f"{drafted / (steps - plain_steps):.3f}" if steps > plain_steps else "-"]
        phases = " / ".join(f"{total.get(f'seconds/{phase}/false', 0.0) / max(plain_steps, 1):.3f}" for phase in PHASES)
        end = last[clients, server]
        print(f"| {clients} | {server} | {steps:.0f} ({steps - plain_steps:.0f}) | {total['row_steps'] / max(steps, 1):.1f} "
              f"| {' / '.join(per)} | {phases} | {total.get('faults', float('nan')) / max(steps, 1):.0f} "
              f"| {total.get('user', float('nan')) / max(steps, 1):.3f} / {total.get('system', float('nan')) / max(steps, 1):.3f} | {drafted / max(plain + drafted, 1e-9):.1%} "
              f"| {end.get('acceptance/model', float('nan')):.2f} | {end.get('gain', float('nan')):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], each_wave=sys.argv[2:] == ["waves"])

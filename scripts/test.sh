#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, real-model tests included.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow and not real_model"` for the
# quick tests (a few minutes), `-m "not real_model"` for all tests on tiny models.
#
# Two runs: the tiny-model tests on one worker per core (at most four, pytest-xdist), then the
# real-model tests in one process, so that one process at a time holds the demo models (several
# GiB each). A `-m EXPR` given here selects within both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cores=$(nproc)
workers=$(( cores < 4 ? cores : 4 ))
select="" args=()
while (( $# )); do
  if [[ $1 == -m ]]; then select=$2; shift 2; else args+=("$1"); shift; fi
done
tiny="not real_model" real="real_model"
if [[ -n $select ]]; then tiny="($select) and not real_model" real="($select) and real_model"; fi
# Probe the machine once, alone, before the workers start: a probe taken while other processes
# use the cores is not cached (quickdraft.hardware), and every test process would then probe again.
.venv/bin/python -c "from quickdraft.hardware import machine_config; machine_config()"
tiny_rc=0 real_rc=0
.venv/bin/python -m pytest -n "$workers" -m "$tiny" ${args[@]+"${args[@]}"} || tiny_rc=$?
.venv/bin/python -m pytest -m "$real" ${args[@]+"${args[@]}"} || real_rc=$?
# pytest exits 5 when it collects no test: fine for one run, a failure when both collected none.
if (( tiny_rc == 5 && real_rc == 5 )); then exit 5; fi
for rc in "$tiny_rc" "$real_rc"; do
  if (( rc != 0 && rc != 5 )); then exit "$rc"; fi
done

#!/usr/bin/env bash
# Batched serving on this machine: cost curve, doctor's prediction for the loadgen prompts, loadgen runs.
set -uo pipefail
PYBIN=/work/main/.venv/bin/python
export PYTHONPATH=/work/frozen/src  # a copy of src at commit aa2a240
OUT=/work/main/docs/results/2026-12-03-batching-zen4
mkdir -p $OUT/runs
cd /work/main/docs/results/2026-12-02-batching-demo
date -u +"start %FT%TZ" > $OUT/times.txt
nice -n -15 $PYBIN ../2026-12-01-batching/cost_curve.py qwen2.5-coder-1.5b-instruct auto > $OUT/cost_curve.txt 2>$OUT/cost_curve.err
date -u +"cost curve done %FT%TZ" >> $OUT/times.txt
nice -n -15 $PYBIN doctor_loadgen.py $OUT/doctor-loadgen.json > $OUT/doctor-loadgen.txt 2>$OUT/doctor-loadgen.err
date -u +"doctor done %FT%TZ" >> $OUT/times.txt
PY="nice -n -15 $PYBIN" TOKENS=64 PER_CLIENT=2 CONFIGS="batch-draft batch-none" REPEATS=4 RUNS=$OUT/runs bash run.sh > $OUT/runs.log 2>&1
date -u +"loadgen done %FT%TZ" >> $OUT/times.txt
PY="nice -n -15 $PYBIN" TOKENS=64 PER_CLIENT=2 CONFIGS="sequential-draft" LEVELS="1 16" REPEATS=1 RUNS=$OUT/runs bash run.sh > $OUT/runs-seq.log 2>&1
date -u +"sequential done %FT%TZ" >> $OUT/times.txt
$PYBIN ../2026-12-01-batching/summarize.py $OUT/runs > $OUT/summary-tables.md 2>&1
date -u +"end %FT%TZ" >> $OUT/times.txt

#!/usr/bin/env bash
# How docs/results/2026-12-01-endpoint-3/ was measured (docs/scale-out.md, "Measured here").
# Two `quickdraft serve` of SmolLM2-135M-Instruct with the batched scheduler (the default:
# --scheduler batch, --max-batch-size 32), dtype auto, K = 5: one without speculation (--draft
# none, the baseline) and one with n-gram prompt lookup (--draft ngram, the goodput policy choosing
# k). Both run side by side (an idle one takes no CPU); bench --endpoint runs each level on both in
# turn. 2 torch threads each (the machine's 2 cores). Run as
#   flock "$LOCK" bash docs/results/2026-12-01-endpoint-3/commands.sh   (LOCK: a file every measurement on the machine locks)
# (the lock keeps other measurements and builds on this shared machine off the cores meanwhile;
# `nice` did not rank it above a test suite started from another login session, which ran unlocked meanwhile: the
# kernel schedules by session here, see ../2026-12-01-llamacpp/commands.sh).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/results/2026-12-01-endpoint-3
QD=${QD:-quickdraft}
LOGS=${LOGS:-/tmp/endpoint-3-logs}
mkdir -p "$LOGS"
export OMP_NUM_THREADS=2
SERVERS=()
trap 'kill "${SERVERS[@]}" 2>/dev/null || true' EXIT
nice -n -10 $QD serve --target smollm2-135m-instruct --draft none --port 8781 --log-level info \
    2>"$LOGS/none.log" & SERVERS+=($!)
nice -n -10 $QD serve --target smollm2-135m-instruct --draft ngram --port 8782 --log-level info \
    2>"$LOGS/ngram.log" & SERVERS+=($!)
for port in 8781 8782; do
  for _ in $(seq 600); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
done
nice -n -10 $QD bench --endpoint http://127.0.0.1:8781 --endpoint-label plain \
    --endpoint http://127.0.0.1:8782 --endpoint-label ngram \
    --prompts-per-category 2 --max-new-tokens 64 --concurrency 1,4,16 --output "$OUT"

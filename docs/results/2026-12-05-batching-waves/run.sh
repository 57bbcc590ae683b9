#!/usr/bin/env bash
# Speculation on against off at one concurrency level, in alternating waves: both servers stay up
# (the demo pair with `quickdraft serve`'s defaults, and the same with --draft none; ~10 GB
# together), and each wave of CLIENTS x PER_CLIENT requests goes to one of them, the order of each
# pair of waves swapped every other repeat. An idle server waits on a condition and takes no CPU,
# so each pair of waves ran back to back under the same host load: the ratios of adjacent waves
# cancel the minutes-long swings that two whole server runs met (±30% a pair, the runs of
# ../2026-12-05-batching-int4). Files are named as ../2026-12-02-batching-demo/run.sh names
# them, so ../2026-12-01-batching/summarize.py RUNS pairs them by repeat.
# STARTED (default "batch-draft batch-none") is the order the servers start in: with two servers
# side by side, the one started first ran 15-25% slower in ../2026-12-02-batching-demo, whatever
# it served, so a second run with the order reversed balances that.
# ONE_SERVER=1 starts the batch-draft server only, and sends the batch-none waves to it with
# `loadgen --num-speculative-tokens 0` (each request decoded without speculation): speculation on
# and off in one process, whose speed the two configurations then share.
# Usage: LEVELS="16 32" REPEATS=6 PER_CLIENT=2 RUNS=runs [STARTED="batch-none batch-draft"] [DRAFT=none]
#        [SERVE_ARGS="--draft-quantization int8"] [ONE_SERVER=1] bash run.sh
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-python}
REPEATS=${REPEATS:-6}
LEVELS=${LEVELS:-16 32}
TOKENS=${TOKENS:-32}
PER_CLIENT=${PER_CLIENT:-2}
RUNS=${RUNS:-runs}
STARTED=${STARTED:-batch-draft batch-none}
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=${DRAFT:-qwen2.5-coder-0.5b-instruct}  # what the batch-draft server drafts with (none: an A/A run)
SERVE_ARGS=${SERVE_ARGS:-}  # more options for the batch-draft server (e.g. --draft-quantization int8)
declare -A DRAFTS=([batch-draft]=$DRAFT [batch-none]=none)
declare -A PORTS=([batch-draft]=8571 [batch-none]=8572)
declare -A LOADGEN_ARGS=([batch-draft]="" [batch-none]="")
if [ "${ONE_SERVER:-0}" = 1 ]; then
  STARTED=batch-draft
  PORTS[batch-none]=${PORTS[batch-draft]}
  LOADGEN_ARGS[batch-none]="--num-speculative-tokens 0"
fi
declare -A SERVER_PIDS=()
mkdir -p "$RUNS/warmup" "$RUNS/metrics"
WAVE=0
scrape() {  # $1 config, $2 wave name: /metrics and the server's /proc/PID/stat (page faults, user and
  # system CPU time) after each wave, numbered in the order they ran (wave_phases.py)
  WAVE=$((WAVE + 1))
  local name
  name="$RUNS/metrics/$(printf %03d $WAVE)-$1-$2"
  curl -sf "127.0.0.1:${PORTS[$1]}/metrics" >"$name.metrics" || true
  cat "/proc/${SERVER_PIDS[$1]:-${SERVER_PIDS[batch-draft]}}/stat" >"$name.stat" || true
}
for port in "${PORTS[@]}"; do  # a server still stopping there would answer the health checks
  if curl -sf "127.0.0.1:$port/health" >/dev/null; then echo "port $port is in use: stop that server first" >&2; exit 1; fi
done
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for config in $STARTED; do
  $PY -m quickdraft serve --target "$TARGET" --draft "${DRAFTS[$config]}" --max-batch-size 32 --max-queue 64 \
      --port "${PORTS[$config]}" --log-level warning \
      $([ "$config" = batch-draft ] && echo "$SERVE_ARGS") 2>"$RUNS/$config.serve.log" &
  PIDS+=($!)
  SERVER_PIDS[$config]=$!
  # One at a time: two servers loading at once would each probe the machine while the other loads.
  for _ in $(seq 900); do curl -sf "127.0.0.1:${PORTS[$config]}/health" >/dev/null && break; sleep 1; done
done
for clients in $LEVELS; do
  requests=$(( clients * PER_CLIENT ))
  # A first wave to each server, not counted: the first forwards of a new batch shape build kernels.
  for config in batch-draft batch-none; do
    $PY -m quickdraft loadgen --url "http://127.0.0.1:${PORTS[$config]}" --concurrency "$clients" \
        --requests "$clients" --max-tokens "$TOKENS" --label "$config" --json "$RUNS/warmup/$config-c$clients.json" \
        ${LOADGEN_ARGS[$config]}
    scrape "$config" "c$clients-warmup"
  done
  for repeat in $(seq "$REPEATS"); do
    order="batch-draft batch-none"
    (( repeat % 2 == 0 )) && order="batch-none batch-draft"
    for config in $order; do
      $PY -m quickdraft loadgen --url "http://127.0.0.1:${PORTS[$config]}" --concurrency "$clients" \
          --requests "$requests" --max-tokens "$TOKENS" --label "$config" --json "$RUNS/$config-c$clients-r$repeat.json" \
          ${LOADGEN_ARGS[$config]}
      scrape "$config" "c$clients-r$repeat"
    done
  done
done
for config in batch-draft batch-none; do
  curl -sf "127.0.0.1:${PORTS[$config]}/metrics" >"$RUNS/$config.metrics" || true
done
$PY ../2026-12-01-batching/summarize.py "$RUNS"

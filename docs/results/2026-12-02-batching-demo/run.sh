#!/usr/bin/env bash
# Batched serving on the demo pair, measured with `quickdraft loadgen`: Qwen2.5-Coder-1.5B-Instruct
# target, Qwen2.5-Coder-0.5B-Instruct draft, every other setting quickdraft serve's default (dtype
# and packing chosen for this machine, int8 draft, K = 5, prompt lookup in front of the draft),
# TOKENS greedy tokens a request (ignore_eos; default 32) at LEVELS clients (default 1 4 16 32), for
# the CONFIGS (default all three) into the folder RUNS (default runs):
#   batch-draft       continuous batching, the goodput policy choosing k per row
#   batch-none        continuous batching without speculation (--draft none)
#   sequential-draft  one request at a time (--scheduler sequential), adaptive K: before batching
# The three servers run side by side (an idle one takes no CPU) and the levels are interleaved
# across them, repeated REPEATS times; quote medians (../2026-12-01-batching/summarize.py runs).
# The servers start in the order of CONFIGS, and on the 2-core VM of report.md the one started
# first ran 15-25% slower whatever it served: run again with CONFIGS in the other order.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-python}
REPEATS=${REPEATS:-2}
LEVELS=${LEVELS:-1 4 16 32}
TOKENS=${TOKENS:-32}
CONFIGS=${CONFIGS:-batch-draft batch-none sequential-draft}
RUNS=${RUNS:-runs}
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
mkdir -p "$RUNS"
declare -A PORTS=([batch-draft]=8571 [batch-none]=8572 [sequential-draft]=8573)
declare -A DRAFTS=([batch-draft]=$DRAFT [batch-none]=none [sequential-draft]=$DRAFT)
SERVERS=()
trap 'kill "${SERVERS[@]}" 2>/dev/null || true' EXIT
for config in $CONFIGS; do
  $PY -m quickdraft serve --target "$TARGET" --draft "${DRAFTS[$config]}" --scheduler "${config%%-*}" \
      --max-batch-size 32 --max-queue 64 --port "${PORTS[$config]}" --log-level warning 2>"$RUNS/$config.serve.log" &
  SERVERS+=($!)
  # One load at a time: loading and packing the 1.5B takes both cores.
  for _ in $(seq 900); do curl -sf "127.0.0.1:${PORTS[$config]}/health" >/dev/null && break; sleep 1; done
done
for repeat in $(seq "$REPEATS"); do
  for clients in $LEVELS; do
    requests=$(( clients < 8 ? 8 : clients ))
    for config in $CONFIGS; do
      $PY -m quickdraft loadgen --url "http://127.0.0.1:${PORTS[$config]}" --concurrency "$clients" \
          --requests "$requests" --max-tokens "$TOKENS" --label "$config" --json "$RUNS/$config-c$clients-r$repeat.json"
    done
  done
done
$PY ../2026-12-01-batching/summarize.py "$RUNS"

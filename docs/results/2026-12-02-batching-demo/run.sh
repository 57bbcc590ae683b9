#!/usr/bin/env bash
# Batched serving on the demo pair, measured with `quickdraft loadgen`: Qwen2.5-Coder-1.5B-Instruct
# target, Qwen2.5-Coder-0.5B-Instruct draft, every other setting quickdraft serve's default (dtype
# and packing chosen for this machine, int8 draft, K = 5, prompt lookup in front of the draft),
# TOKENS greedy tokens a request (ignore_eos; default 32) at LEVELS clients (default 1 4 16 32),
# max(8, PER_CLIENT x clients) requests a level (PER_CLIENT default 1; more makes each level
# longer and steadier: with 8 requests, 4 clients send two waves), for
# the CONFIGS (default all three) into the folder RUNS (default runs):
#   batch-draft       continuous batching, the goodput policy choosing k per row
#   batch-none        continuous batching without speculation (--draft none)
#   sequential-draft  one request at a time (--scheduler sequential), adaptive K: before batching
# One server runs at a time: each repeat starts each configuration's server, runs every level
# against it and stops it, the configurations in CONFIGS order on odd repeats and reversed on even
# ones (with servers side by side, the one started first ran 15-25% slower on the VM of report.md,
# whatever it served). Quote medians and the paired ratios (../2026-12-01-batching/summarize.py RUNS).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-python}
REPEATS=${REPEATS:-2}
FIRST=${FIRST:-1}  # the first repeat's number: FIRST=4 REPEATS=4 adds a fourth to a run of three
LEVELS=${LEVELS:-1 4 16 32}
TOKENS=${TOKENS:-32}
PER_CLIENT=${PER_CLIENT:-1}
CONFIGS=${CONFIGS:-batch-draft batch-none sequential-draft}
RUNS=${RUNS:-runs}
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
PORT=8571
mkdir -p "$RUNS"
declare -A DRAFTS=([batch-draft]=$DRAFT [batch-none]=none [sequential-draft]=$DRAFT)
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true' EXIT
for repeat in $(seq "$FIRST" "$REPEATS"); do
  order=$CONFIGS
  (( repeat % 2 == 0 )) && order=$(printf '%s\n' $CONFIGS | tac | xargs)
  for config in $order; do
    $PY -m quickdraft serve --target "$TARGET" --draft "${DRAFTS[$config]}" --scheduler "${config%%-*}" \
        --max-batch-size 32 --max-queue 64 --port "$PORT" --log-level warning 2>"$RUNS/$config-r$repeat.serve.log" &
    SERVER=$!
    for _ in $(seq 900); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
    for clients in $LEVELS; do
      requests=$(( clients * PER_CLIENT < 8 ? 8 : clients * PER_CLIENT ))
      $PY -m quickdraft loadgen --url "http://127.0.0.1:$PORT" --concurrency "$clients" \
          --requests "$requests" --max-tokens "$TOKENS" --label "$config" --json "$RUNS/$config-c$clients-r$repeat.json"
    done
    curl -sf "127.0.0.1:$PORT/metrics" >"$RUNS/$config-r$repeat.metrics" || true
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
  done
done
$PY ../2026-12-01-batching/summarize.py "$RUNS"

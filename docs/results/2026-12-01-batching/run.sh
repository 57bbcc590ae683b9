#!/usr/bin/env bash
# Batched serving measured with `quickdraft loadgen`: SmolLM2-135M-Instruct (bfloat16), prompt
# lookup (n-gram) drafts, 32 greedy tokens a request (ignore_eos), 1 / 4 / 16 / 32 clients, for
#   batch-ngram       continuous batching, the goodput policy choosing k (K = 5)
#   batch-none        continuous batching without speculation
#   sequential-ngram  one request at a time (--scheduler sequential), adaptive k: as before batching
# The three servers run side by side (an idle one takes no CPU) and the loadgen levels are
# interleaved across them, repeated REPEATS times, so that the other processes sharing this
# 2-core machine weigh on every configuration alike; quote medians (summarize.py).
# OMP_NUM_THREADS=1: on cores other processes keep busy, two threads wait for each other
# (docs/server.md); one thread per server is what such a machine can give.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-python}
REPEATS=${REPEATS:-2}
FIRST=${FIRST:-1}
export OMP_NUM_THREADS=1
mkdir -p runs
declare -A PORTS=([batch-ngram]=8471 [batch-none]=8472 [sequential-ngram]=8473)
SERVERS=()
trap 'kill "${SERVERS[@]}" 2>/dev/null || true' EXIT
for config in "${!PORTS[@]}"; do
  $PY -m quickdraft serve --target smollm2-135m-instruct --draft "${config##*-}" --dtype bfloat16 --device cpu \
      --scheduler "${config%%-*}" --max-batch-size 32 --max-queue 64 --port "${PORTS[$config]}" \
      --log-level warning 2>"runs/$config.serve.log" &
  SERVERS+=($!)
done
for port in "${PORTS[@]}"; do
  for _ in $(seq 600); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
done
for repeat in $(seq "$FIRST" "$REPEATS"); do
  for clients in 1 4 16 32; do
    for config in batch-ngram batch-none sequential-ngram; do
      $PY -m quickdraft loadgen --url "http://127.0.0.1:${PORTS[$config]}" --concurrency "$clients" --requests 8 \
          --max-tokens 32 --label "$config" --json "runs/$config-c$clients-r$repeat.json"
    done
  done
done

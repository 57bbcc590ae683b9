#!/bin/bash
# Native level: HumanEval, 40 problems x 128 tokens, default against plain decoding (dtype=auto).
export PYTHONPATH=/work/frozen/src
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default --no-peer \
  --categories code --prompts-per-category 40 --max-new-tokens 128 --k-sweep none --temperatures "" \
  --check-prompts 2 --quiet-wait 10

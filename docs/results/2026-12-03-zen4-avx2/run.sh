#!/usr/bin/env bash
set -uo pipefail
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
export PYTHONPATH=/work/frozen/src  # a copy of src at commit 6782d72
QD="nice -n -15 /work/main/.venv/bin/python -m quickdraft"
OUT=/work/main/docs/results/2026-12-03-zen4-avx2
mkdir -p $OUT
date -u +"start %FT%TZ" > $OUT/times.txt
/work/main/.venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())" > $OUT/restriction-check.txt 2>&1
$QD bench --output $OUT --threads 2 --methods plain,default --plain-formats float32,bfloat16 --no-peer \
  --prompts-per-category 1 --max-new-tokens 64 --k-sweep none --temperatures 1.0 \
  --temperature-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default --sweep-prompts 1 --quiet-wait 10 > $OUT/bench.log 2>&1
date -u +"bench done %FT%TZ" >> $OUT/times.txt

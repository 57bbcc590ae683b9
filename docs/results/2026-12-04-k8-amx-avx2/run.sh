#!/bin/bash
# The defaults with K = 8 against K = 5 and plain decoding, one prompt per category, 64 tokens,
# T = 0, two repeats: natively (AMX) and restricted to AVX2 (the few-row kernel's path).
# Usage: bash run.sh native|avx2 OUTPUT_DIR
export PYTHONPATH=/work/frozen/src
if [ "$1" = avx2 ]; then
  export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
fi
python -c "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())" > "capability-$1.txt"
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$2" --threads 2 --methods plain,default -k 8 --no-peer \
  --prompts-per-category 1 --repeats 2 --max-new-tokens 64 --temperatures "" \
  --k-sweep 5 --k-sweep-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default --sweep-prompts 1 --check-prompts 2 --quiet-wait 10

#!/bin/bash
# The defaults (dtype=auto: packed or widened bfloat16 target, int4 draft, K = 5) against plain
# decoding (dtype=auto), one prompt per category, 64 tokens, T = 0 and T = 1, two interleaved
# repeats, natively (AMX) or restricted to AVX2. Usage: bash run.sh native|avx2 OUTPUT_DIR
export PYTHONPATH=/work/frozen/src
if [ "$1" = avx2 ]; then
  export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
fi
/work/main/.venv/bin/python -c "import torch; print('ATen', torch.backends.cpu.get_cpu_capability(), 'oneDNN bfloat16', torch.ops.mkldnn._is_mkldnn_bf16_supported())" > "capability-$1.txt"
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$2" --threads 2 --methods plain,default \
  --no-peer --prompts-per-category 1 --repeats 2 --max-new-tokens 64 --k-sweep none --temperatures 1.0 \
  --temperature-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default --sweep-prompts 1 --check-prompts 2 --quiet-wait 10

#!/bin/bash
# A real AVX2 machine (AMD EPYC Zen 3, no AVX-512): the defaults (dtype=auto) against plain decoding
# in the default dtype, stock float32 and stock bfloat16, two interleaved repeats, T = 0 and T = 1.
export PYTHONPATH=/work/frozen/src
python -c "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())" > capability.txt
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default --plain-formats float32,bfloat16 \
  --no-peer --prompts-per-category 1 --repeats 2 --max-new-tokens 64 --k-sweep none --temperatures 1.0 \
  --temperature-categories mt_bench,translation,summarization,qa,math_reasoning,rag,code \
  --sweep-methods default --sweep-prompts 1 --quiet-wait 10

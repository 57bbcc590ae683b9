#!/bin/bash
# Native level (AMX): HumanEval, 40 problems x 128 tokens: the defaults (K = 5, dtype=auto: int4
# draft) against plain decoding, interleaved per problem. $1: the output folder.
export PYTHONPATH=/work/frozen/src
/work/main/.venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())" > capability.txt
lscpu > lscpu.txt
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default --no-peer \
  --categories code --prompts-per-category 40 --max-new-tokens 128 --temperatures "" --k-sweep "" \
  --check-prompts 2 --quiet-wait 10

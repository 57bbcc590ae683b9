#!/bin/bash
# Native level (AMX): HumanEval, 40 problems x 128 tokens: the defaults with K = 8 against plain
# decoding (dtype=auto, interleaved per problem), then the defaults with K = 5 on the same problems.
export PYTHONPATH=/work/frozen/src
python -c "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())" > capability.txt
nice -n -15 /work/main/.venv/bin/quickdraft bench --output "$1" --threads 2 --methods plain,default -k 8 --no-peer \
  --categories code --prompts-per-category 40 --max-new-tokens 128 --temperatures "" \
  --k-sweep 5 --k-sweep-categories code --sweep-methods default --sweep-prompts 40 \
  --check-prompts 2 --quiet-wait 10

#!/bin/bash
# The demo target's batched forward cost over rows x positions at the AVX2 level, dtype=auto.
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
nice -n -15 python "$(dirname "$0")/../2026-12-01-batching/cost_curve.py" qwen2.5-coder-1.5b-instruct auto

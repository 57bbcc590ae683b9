#!/bin/bash
# quickdraft doctor on the demo pair, default options (dtype=auto: the int4 draft where its kernel runs);
# "avx2" restricts the kernels to AVX2.
export PYTHONPATH=/work/frozen/src
if [ "$1" = avx2 ]; then export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2; fi
nice -n -15 /work/main/.venv/bin/quickdraft doctor qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --json > "doctor-$1.json"
/work/main/.venv/bin/quickdraft doctor --report-from "doctor-$1.json" > "doctor-$1.txt"

#!/bin/bash
# How docs/results/2026-12-01-endpoint-2/ was measured (see docs/scale-out.md, "Measured here").
# Two servers of the same small model, one without speculation and one with n-gram lookup
# (quickdraft serve's defaults otherwise: K = 5, adaptive K), one thread each because the
# machine's 2 cores were shared with other benchmarks (docs/server.md), both niced.
OMP_NUM_THREADS=1 nice -n 10 quickdraft serve --target smollm2-135m-instruct --draft none --port 8771 --log-level warning &
OMP_NUM_THREADS=1 nice -n 10 quickdraft serve --target smollm2-135m-instruct --draft ngram --port 8772 --log-level warning &
# once both answer /health:
nice -n 10 quickdraft bench --endpoint http://127.0.0.1:8771 --endpoint-label plain \
    --endpoint http://127.0.0.1:8772 --endpoint-label ngram \
    --prompts-per-category 1 --max-new-tokens 64 --concurrency 1,4,16 --output docs/results/2026-12-01-endpoint-2

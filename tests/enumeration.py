"""Exact output distributions by enumeration, and the empirical ones of seeded decoders.

The reference is plain decoding written the naive way: for every possible continuation, one
forward over the whole prefix without a cache, the sampling options applied to that single row
after committing the continuation token by token (``LogitsProcessor.commit``), then
``logits_to_probs``. The engine's vectorised, speculative path is tested against it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import torch

from conftest import chi_square_p_value
from quickdraft import SamplingParams, SpeculativeDecoder
from quickdraft.models.base import LoadedModel
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import log_probs, logits_to_probs


def reference_logits(model: LoadedModel, prompt: Sequence[int], output: Sequence[int],
                     params: SamplingParams) -> torch.Tensor:
    """``[V]`` plain decoding's processed logits after ``prompt + output`` (no cache)."""
    eos = sorted(model.eos_token_ids) + list(params.stop_token_ids)
    processor = LogitsProcessor(params, model.vocab_size, list(prompt), model.tokenizer, eos)
    processor.commit(list(output))
    with torch.inference_mode():
        logits = model.module(input_ids=torch.tensor([list(prompt) + list(output)])).logits[0, -1]  # [V]
    return processor(logits[None])[0]


def reference_logprob(model, prompt, output, params) -> torch.Tensor:
    """``[V]`` what plain decoding reports as log-probabilities after ``prompt + output``."""
    return log_probs(reference_logits(model, prompt, output, params), params)


def exact_outcomes(model: LoadedModel, prompt: Sequence[int], params: SamplingParams) -> dict[tuple[int, ...], float]:
    """Probability of every output of plain sampling (up to ``max_new_tokens``, or an end token)."""
    ends = (frozenset() if params.ignore_eos else model.eos_token_ids) | frozenset(params.stop_token_ids)
    outcomes: dict[tuple[int, ...], float] = {}

    def walk(output: tuple[int, ...], prob: float) -> None:
        if len(output) == params.max_new_tokens or (output and output[-1] in ends):
            outcomes[output] = prob
            return
        step = logits_to_probs(reference_logits(model, prompt, output, params), params).double()
        for token in step.nonzero().flatten().tolist():
            walk(output + (token,), prob * float(step[token]))

    walk((), 1.0)
    return outcomes


def sampled_outcomes(decoder: SpeculativeDecoder, prompt: Sequence[int],
                     params_for_seed: Callable[[int], SamplingParams], runs: int) -> Counter:
    """How often each output came out of ``runs`` seeded generations."""
    return Counter(tuple(decoder.generate(prompt, params_for_seed(seed)).token_ids) for seed in range(runs))


def outcome_p_value(counts: Counter, exact: dict[tuple[int, ...], float]) -> float:
    """Chi-square p-value of sampled outputs against exact probabilities (an impossible output: 0)."""
    if any(outcome not in exact for outcome in counts):
        return 0.0
    cells = sorted(exact)
    observed = torch.tensor([counts[c] for c in cells], dtype=torch.float64)
    return chi_square_p_value(observed, torch.tensor([exact[c] for c in cells], dtype=torch.float64))

"""From logits to the distribution a token is drawn from, and drawing it.

The same function turns the target's logits into p and the draft's logits into q, so the two
are always filtered by the same temperature, top-k, top-p and min-p (the rejection rule is only
lossless when q is exactly the distribution the draft token was drawn from). The options that
depend on the text so far (penalties, logit bias, structured output) come before, in
``quickdraft.processing``.
"""

from __future__ import annotations

import torch

from quickdraft.config import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p, then min-p, and return probabilities.

    Args:
        logits: ``[..., V]`` raw logits in any float dtype; ``-inf`` entries are allowed.
        params: sampling parameters with ``temperature > 0``.

    Returns:
        ``[..., V]`` float32 probabilities; filtered-out tokens have probability exactly 0.
    """
    if params.greedy:
        raise ValueError("logits_to_probs needs temperature > 0; greedy decoding uses argmax")
    # float32 throughout: bf16 softmax loses the small probabilities the acceptance ratio needs.
    scores = logits.float() / params.temperature
    # NaN would poison every comparison below; treat it as "never this token".
    scores = torch.nan_to_num(scores, nan=float("-inf"), posinf=torch.finfo(torch.float32).max)
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Mass strictly before each token: a token is kept while the tokens ranked above it
        # hold less than top_p, so the token that crosses top_p is kept (nucleus sampling).
        # An exclusive cumulative sum, not ``cumsum - probs``: the subtraction rounds (0.9 - 0.1
        # = 0.79999995 in float32) and kept one token too many when the mass lands on top_p.
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        mass_before = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1)
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False  # the most likely token always survives
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.min_p > 0.0:
        # transformers' MinPLogitsWarper: keep tokens at least min_p times as likely as the
        # most likely one (which always survives), then renormalise.
        floor = params.min_p * probs.amax(dim=-1, keepdim=True)  # [..., 1]
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def log_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The log-probabilities reported for emitted tokens (``logprobs``): ``[..., V]`` float32.

    Sampling: the log of the distribution the token is drawn from (``logits_to_probs``), so a
    token top-k / top-p / min-p removed has ``-inf``. Greedy decoding has no such distribution:
    it reports the softmax of the (processed) logits at temperature 1, without filters, as
    OpenAI's greedy log-probabilities are.
    """
    if params.greedy:
        return torch.log_softmax(torch.nan_to_num(logits.float(), nan=float("-inf")), dim=-1)
    return torch.log(logits_to_probs(logits, params))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row.

    Args:
        probs: ``[..., V]`` probabilities (need not be normalised; must have a positive entry).
        generator: the random source; the same seed gives the same draws.

    Returns:
        ``[...]`` int64 token ids.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, num_samples=1, generator=generator)  # [N, 1]
    return drawn.reshape(probs.shape[:-1])


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the vocabulary: ``[..., V]`` -> ``[...]`` int64 (NaN-safe)."""
    return torch.nan_to_num(logits.float(), nan=float("-inf")).argmax(dim=-1)

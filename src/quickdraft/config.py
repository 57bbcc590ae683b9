"""Sampling parameters: a small frozen dataclass, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quickdraft.errors import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen, applied identically to the target and the draft.

    Attributes:
        temperature: 0 means greedy decoding (argmax); > 0 divides the logits before softmax.
        top_k: keep only the ``top_k`` most likely tokens; 0 disables the filter.
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``
            (nucleus sampling); 1.0 disables the filter.
        max_new_tokens: generation stops after exactly this many new tokens at most.
        seed: seeds the ``torch.Generator`` used for every random draw; ``None`` draws a seed.
        stop: strings that end generation; the returned text stops before the first match.
        ignore_eos: keep generating past the end-of-sequence token (benchmarks use this so
            every method produces the same number of tokens).

    The filters are applied in the order temperature, top-k, top-p, as transformers does.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidParameterError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidParameterError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}"
            )
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise InvalidParameterError(f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0)."""
        return self.temperature == 0.0

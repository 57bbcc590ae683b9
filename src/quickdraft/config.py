"""Sampling parameters: a small frozen dataclass, validated on construction."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quickdraft.errors import InvalidParameterError

# OpenAI's ranges (https://platform.openai.com/docs/api-reference/chat/create).
PENALTY_RANGE = (-2.0, 2.0)
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_TOP_LOGPROBS = 20
MAX_N = 128


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen, applied identically to the target and the draft.

    Attributes:
        temperature: 0 means greedy decoding (argmax); > 0 divides the logits before softmax.
        top_k: keep only the ``top_k`` most likely tokens; 0 disables the filter.
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``
            (nucleus sampling); 1.0 disables the filter.
        min_p: drop tokens less likely than ``min_p`` times the most likely one; 0 disables it.
        max_new_tokens: generation stops after exactly this many new tokens at most.
        seed: seeds the ``torch.Generator`` used for every random draw; ``None`` draws a seed.
        stop: strings that end generation; the returned text stops before the first match.
        stop_token_ids: token ids that end generation like the end-of-sequence token (and are
            part of the output, as it is).
        ignore_eos: keep generating past the end-of-sequence token (benchmarks use this so
            every method produces the same number of tokens).
        repetition_penalty: transformers' and vLLM's: the logit of every token that occurs in
            the prompt or the output so far is divided by it if positive, multiplied by it if
            negative; 1.0 disables it, > 1 discourages repetition.
        presence_penalty: OpenAI's: subtracted from the logit of every token that occurs in
            the output so far (the prompt does not count, as in vLLM); in [-2, 2].
        frequency_penalty: OpenAI's: subtracted once per occurrence in the output so far; in [-2, 2].
        logit_bias: OpenAI's: ``{token id: bias}`` added to the logits, biases in [-100, 100]
            (-100 bans a token, 100 all but forces it). Given as a mapping, kept as sorted pairs.
        logprobs: report the log-probability of each emitted token (``StreamChunk.logprobs``).
        top_logprobs: also report this many most likely tokens at each position (needs
            ``logprobs``); at most 20, as OpenAI.
        n: how many independent samples of the prompt to generate (``SpeculativeDecoder.stream``
            yields each in turn; the prompt's prefill is shared).
        response_format: OpenAI's ``{"type": "text" | "json_object" | "json_schema", ...}``:
            ``json_object`` constrains the output to a JSON object, ``json_schema`` (with
            ``{"json_schema": {"schema": {...}}}``) to JSON valid under that schema.
        regex: constrain the output to match this regular expression (whole output).
        grammar: constrain the output to this Lark grammar (llguidance's dialect).
        num_speculative_tokens: the most tokens drafted per step for this request, at most the
            decoder's K (0: no speculation, plain decoding; None or more: the decoder's K). The output
            does not depend on it (a seeded sampled request's exact output does, as on K).

    The options are applied in one place, ``quickdraft.processing``, in this order: logit bias,
    repetition penalty, frequency and presence penalties, the structured-output constraint,
    then temperature, top-k, top-p, min-p (docs/sampling.md).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    response_format: Mapping[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    num_speculative_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        try:
            pairs = tuple(sorted((_token_id(t), float(b)) for t, b in bias))
        except (TypeError, ValueError) as error:
            raise InvalidParameterError(f"logit_bias must map token ids to numbers: {error}") from None
        object.__setattr__(self, "logit_bias", pairs)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidParameterError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidParameterError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidParameterError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}"
            )
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise InvalidParameterError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidParameterError(f"stop_token_ids must be token ids >= 0, got {self.stop_token_ids!r}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InvalidParameterError(
                f"repetition_penalty must be a number > 0 (1 = off), got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise InvalidParameterError(f"{name} must be in [-2, 2] (0 = off), got {value}")
        for token, value in self.logit_bias:
            if not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]:
                raise InvalidParameterError(f"logit_bias values must be in [-100, 100], got {value} for token {token}")
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidParameterError(f"top_logprobs must be an integer in [0, 20], got {self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidParameterError("top_logprobs needs logprobs=True")
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise InvalidParameterError(f"n must be an integer in [1, {MAX_N}], got {self.n}")
        k = self.num_speculative_tokens
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise InvalidParameterError(
                f"num_speculative_tokens must be an integer >= 0 (0 = no speculation), or None for the decoder's K; "
                f"got {k!r}"
            )
        self._check_structured()

    def _check_structured(self) -> None:
        given = [name for name in ("regex", "grammar") if getattr(self, name) is not None]
        if self.response_format is not None:
            kind = self.response_format.get("type") if isinstance(self.response_format, Mapping) else None
            if kind not in ("text", "json_object", "json_schema"):
                raise InvalidParameterError(
                    "response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}, "
                    f"got {self.response_format!r}"
                )
            if kind == "json_schema":
                spec = self.response_format.get("json_schema")
                if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), (Mapping, bool)):
                    raise InvalidParameterError(
                        "response_format {'type': 'json_schema'} needs 'json_schema': {'name': ..., "
                        "'schema': {...}}"
                    )
            if kind != "text":
                given.append("response_format")
        if len(given) > 1:
            raise InvalidParameterError(f"give at most one of response_format, regex, grammar; got {given}")
        if given and self.ignore_eos:
            raise InvalidParameterError(
                "ignore_eos cannot be combined with structured output: the output ends where the "
                "constraint is complete"
            )

    def speculative_tokens(self, k: int) -> int:
        """The most tokens drafted per step for this request where the decoder's K is ``k``."""
        return k if self.num_speculative_tokens is None else min(k, self.num_speculative_tokens)

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def constrained(self) -> bool:
        """True when the output is constrained (JSON, a regular expression or a grammar)."""
        kind = None if self.response_format is None else self.response_format["type"]
        return self.regex is not None or self.grammar is not None or kind in ("json_object", "json_schema")


def _token_id(token: Any) -> int:
    # OpenAI sends logit_bias keys as strings ("50256"); bool is an int subclass, not an id.
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise ValueError(f"{token!r} is not a token id")
    return int(token)

"""Structured output: a token-level constraint from llguidance that advances and rolls back.

``response_format`` (JSON object / JSON schema), ``regex`` and ``grammar`` (Lark) compile to one
llguidance grammar. A ``Constraint`` holds the matcher of one generation: its state is the
output committed so far; ``masks`` answers "which tokens may come next" after each of several
drafted continuations (consuming their tokens, then rolling them back), so the target's p and
the draft's q are masked by the state each row's own prefix reaches, and the rejection rule
keeps the constrained target's distribution exactly. ``forced`` gives the tokens the grammar
leaves no choice about (keys, quotes, braces), which the engines draft for free
(``quickdraft.drafters.forced``).

llguidance (https://github.com/guidance-ai/llguidance) computes a mask in 0.05-0.2 ms on a
152k vocabulary and compiles a schema in about 1 ms; it needs no network (the tokenizer comes
from the model's own HF tokenizer).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError

# Building llguidance's view of a 152k vocabulary takes about a second: once per tokenizer
# (and logits width and end tokens).
_LL_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_of(params: SamplingParams) -> str | None:
    """The llguidance grammar of ``params``' output constraint, or None if it has none."""
    if params.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.grammar is not None:
        return llguidance.LLMatcher.grammar_from_lark(params.grammar)
    kind = None if params.response_format is None else params.response_format["type"]
    if kind not in ("json_object", "json_schema"):
        return None
    schema = {"type": "object"}
    if kind == "json_schema":
        schema = params.response_format["json_schema"].get("schema", {})
    # Compact JSON, no free whitespace: shorter output, and a model cannot spin forever in the
    # whitespace between the tokens that matter (llguidance's default allows it).
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False}
        )
    except ValueError as error:
        raise InvalidParameterError(f"the JSON schema cannot be compiled: {error}") from None


def _ll_tokenizer(tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> llguidance.LLTokenizer:
    views = _LL_TOKENIZERS.setdefault(tokenizer, {})
    key = (vocab_size, tuple(sorted(eos_token_ids)))
    if key not in views:
        try:
            views[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(key[1]))
        except ValueError as error:
            raise InvalidParameterError(
                f"structured output needs a fast (Rust) Hugging Face tokenizer that llguidance reads: {error}"
            ) from None
    return views[key]


class Constraint:
    """The output constraint of one generation, in the state reached by the committed output.

    Args:
        grammar: from ``grammar_of``.
        tokenizer: the target's Hugging Face fast tokenizer.
        vocab_size: the width of the model's logits (may exceed the tokenizer's vocabulary).
        eos_token_ids: the tokens that end the output; the constraint allows them exactly
            where the output is complete.

    Raises:
        InvalidParameterError: the grammar, schema or regular expression does not compile.
    """

    def __init__(self, grammar: str, tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        if not eos_token_ids:
            raise InvalidParameterError("structured output needs a model with an end-of-sequence token")
        self._tokenizer = _ll_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self._matcher = llguidance.LLMatcher(self._tokenizer, grammar)
        if self._matcher.is_error():
            raise InvalidParameterError(f"the output constraint cannot be compiled: {self._matcher.get_error()}")
        self.vocab_size = vocab_size
        self._ends = frozenset(eos_token_ids)

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past emitted tokens (each was allowed: the target's p was masked).

        An end token ends the output: it is where the constraint allowed it, but a complete
        matcher takes nothing more, so it is not fed.
        """
        tokens = list(tokens)
        ends = [i for i, token in enumerate(tokens) if token in self._ends]
        if ends:
            tokens = tokens[: ends[0]]
        if not self._matcher.consume_tokens(tokens):
            raise RuntimeError(f"the output left its constraint: {self._matcher.get_error()}")

    def forced(self, limit: int, path: Sequence[int] = ()) -> list[int]:
        """The tokens the grammar forces after the committed output and ``path`` (drafted
        tokens), at most ``limit``: the bytes that are the only ones allowed next (llguidance's
        fast-forward bytes), tokenized, as many as the grammar accepts. The state is left as it was.

        They are a draft, not a certainty: the grammar allows every tokenization of those bytes,
        and the target may prefer another one (``{`` then ``"a`` for ``{"`` then ``a``), so
        verification accepts or rejects them as any other draft. llguidance's own fast-forward
        tokens are surer but stop a token short of each forced run (its last token might merge
        with the free bytes after it): on a JSON schema's keys, ``"name":"`` came out as
        ``name`` without ``":"``, half of what is there to draft. An end token is never among
        them (the output's end is the target's to emit), nor are tokens after a ``path`` that
        leaves the constraint.
        """
        path = list(path)
        consumed = self._matcher.try_consume_tokens(path) if path else 0
        tokens = []
        if consumed == len(path) and limit > 0:
            tokens = self._tokenizer.tokenize_bytes(self._matcher.compute_ff_bytes())[:limit]
            tokens = tokens[: self._matcher.validate_tokens(tokens)]
        if consumed:
            self._matcher.rollback(consumed)
        ends = [i for i, token in enumerate(tokens) if token in self._ends]
        return tokens[: ends[0]] if ends else tokens

    def apply(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """Set to -inf the logits of tokens the constraint forbids after each row's path.

        Args:
            logits: ``[R, V]`` float32, row ``r`` predicting the token after the committed
                output followed by ``paths[r]`` (drafted tokens); modified in place.
            paths: ``R`` token lists.

        A row whose path leaves the constraint (a drafted token it forbids, or an end token)
        is left as it is: the forbidden token has target probability 0, so it is rejected,
        and the output ends at an end token; that row's token is never emitted.
        """
        bitmask = llguidance.torch.allocate_token_bitmask(len(paths), self.vocab_size)  # [R, ceil(V / 32)]
        for row, path in enumerate(paths):
            # Host work: the matcher walks token ids; paths are a few tokens.
            consumed = self._matcher.try_consume_tokens(list(path)) if path else 0
            # An end token is never consumed (the output ends there), so rows after it stay
            # unconstrained, as rows after a forbidden token do.
            if consumed == len(path):
                llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, row)
            if consumed:
                self._matcher.rollback(consumed)
        # Unpack the bits ourselves: llguidance's own kernel is torch.compile'd (seconds, a C++
        # compiler) for what is a shift and a mask on a few rows here.
        bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1  # [R, ceil(V / 32), 32]
        allowed = bits.reshape(len(paths), -1)[:, : logits.shape[1]].bool()  # [R, V]
        return logits.masked_fill_(~allowed.to(logits.device), float("-inf"))

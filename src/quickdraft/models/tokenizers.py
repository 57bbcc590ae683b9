"""Checking that a target and a draft speak the same token ids.

Speculation compares the draft's token ids and probabilities with the target's position by
position, so the two must map every token to the same id (identical ``get_vocab()``) and produce
logits of the same width. Equal vocabulary sizes are not enough: two tokenizers of 49,152
tokens can number them differently.

A draft with another tokenizer drafts through the tokens both vocabularies share
(``shared_vocabulary``, ``quickdraft.drafters.cross_tokenizer``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.errors import TokenizerMismatchError
from quickdraft.models.base import LoadedModel

_EXAMPLES = 5
_WHAT_TO_DO = (
    "Use a draft from the same model family as the target (same tokenizer), "
    "or prompt lookup, which needs no draft model (--draft ngram)."
)


def check_tokenizers_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise TokenizerMismatchError unless ``draft``'s token ids mean the same as ``target``'s.

    Both must have a tokenizer, with identical vocabularies (token -> id), or neither (then only
    the logits widths are compared); and both must produce logits of the same width.
    """
    if (target.tokenizer is None) != (draft.tokenizer is None):
        with_one, without = (target, draft) if target.tokenizer is not None else (draft, target)
        raise TokenizerMismatchError(
            f"{with_one.name!r} has a tokenizer and {without.name!r} has none, so their token ids "
            "cannot be checked against each other. Give both models a tokenizer, or neither "
            "(token ids only)."
        )
    if target.tokenizer is not None and draft.tokenizer is not None:
        differences = vocabulary_differences(target.tokenizer, draft.tokenizer)
        if differences:
            raise TokenizerMismatchError(
                f"The target {target.name!r} and the draft {draft.name!r} do not share a vocabulary, "
                "so the draft's token ids mean other tokens to the target.\n"
                + "\n".join(f"  {line}" for line in differences)
                + f"\n{_WHAT_TO_DO}"
            )
    if target.vocab_size != draft.vocab_size:
        raise TokenizerMismatchError(
            f"The target {target.name!r} produces logits over {target.vocab_size:,} token ids and the "
            f"draft {draft.name!r} over {draft.vocab_size:,} (their output layers differ in size, e.g. "
            "padding rows), so their probabilities cannot be compared id by id. "
            f"{_WHAT_TO_DO}"
        )


def vocabulary_differences(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> list[str]:
    """Lines that describe how the two vocabularies differ; empty when they are identical."""
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if target_vocab == draft_vocab:
        return []
    lines = [f"sizes: target {len(target_vocab):,} tokens, draft {len(draft_vocab):,} tokens"]
    # Sorted by the target's id (then the draft's), so the examples are the same on every run.
    shared = sorted(
        (target_vocab[token], token) for token in target_vocab.keys() & draft_vocab.keys()
        if target_vocab[token] != draft_vocab[token]
    )
    if shared:
        examples = ", ".join(f"{token!r} ({tid} vs {draft_vocab[token]})" for tid, token in shared[:_EXAMPLES])
        lines.append(f"{len(shared):,} tokens have different ids (target vs draft), e.g. {examples}")
    for side, vocab, other in (("target", target_vocab, draft_vocab), ("draft", draft_vocab, target_vocab)):
        only = sorted((vocab[token], token) for token in vocab.keys() - other.keys())
        if only:
            examples = ", ".join(repr(token) for _, token in only[:_EXAMPLES])
            lines.append(f"{len(only):,} tokens only in the {side}, e.g. {examples}")
    for role in ("bos_token", "eos_token"):
        target_token, draft_token = getattr(target, role), getattr(draft, role)
        if target_token != draft_token:
            lines.append(f"{role.split('_')[0].upper()}: target {target_token!r}, draft {draft_token!r}")
    return lines


# ---------------------------------------------------------------------------------------------
# Drafts with another tokenizer: which tokens the two vocabularies share (docs/cross_tokenizer.md)

# A draft shares too little with the target below this share of the smaller vocabulary: every
# token outside the intersection is one the draft can never propose. Byte-level BPE families
# share far more (SmolLM2 and Qwen2.5: see docs/cross_tokenizer.md).
MIN_SHARED_FRACTION = 0.25


def shares_token_ids(target: LoadedModel, draft: LoadedModel) -> bool:
    """True when the draft's token ids mean the target's (``check_tokenizers_compatible`` passes),
    False when both have a tokenizer and the vocabularies differ: the draft then drafts through
    the tokens both share (``VocabularyMap``). Raises when only one of them has a tokenizer."""
    try:
        check_tokenizers_compatible(target, draft)
    except TokenizerMismatchError:
        if target.tokenizer is None or draft.tokenizer is None:
            raise
        return False
    return True


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte alphabet, inverted: the character a byte-level BPE vocabulary writes for each
    byte (printable bytes as themselves, the rest shifted past 255, e.g. 'Ġ' for a space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for shifted, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + shifted)
    return {c: b for b, c in chars.items()}


def _decoder_types(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The types of the fast tokenizer's decoder and of the decoders it chains (``Sequence``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerMismatchError(
            f"{type(tokenizer).__name__} is a slow (Python) tokenizer: drafting across tokenizers reads "
            "the vocabulary of a fast one. Load the model with its tokenizer.json (use_fast=True)."
        )
    stack, types = [json.loads(backend.to_str()).get("decoder") or {}], set()
    while stack:
        spec = stack.pop()
        types.add(spec.get("type"))
        stack.extend(spec.get("decoders") or [])
    return types


@dataclass(frozen=True)
class TokenTexts:
    """What each token id of a tokenizer adds to the text, as bytes.

    Bytes, not strings: a byte-level token can hold part of a character's UTF-8 encoding.
    Special tokens stand for their content (``<|im_end|>``); the tokens the tokenizer adds in
    front of every text (a BOS) stand for nothing.

    Attributes:
        texts: ``texts[i]`` the bytes of token id ``i`` (``b""`` for ids the tokenizer lacks, e.g.
            padding rows of the output layer).
        special: ids of special tokens, which match only a special token of the other vocabulary.
        prefix: ids the tokenizer puts before every text (``[bos]`` or ``[]``).
    """

    texts: list[bytes]
    special: frozenset[int]
    prefix: list[int]


def token_texts(tokenizer: PreTrainedTokenizerBase, size: int) -> TokenTexts:
    """The bytes of each of ``size`` token ids (the width of the model's logits).

    Ordinary tokens are read as the tokenizer's decoder reads them: byte-level BPE (GPT-2,
    Llama-3, Qwen, SmolLM2) through its byte alphabet; SentencePiece-style vocabularies with
    '▁' for a space and ``<0xNN>`` byte-fallback tokens (Gemma, Llama-2); anything else as the
    UTF-8 of the token's string. Added tokens are their content.
    """
    types = _decoder_types(tokenizer)
    byte_level = "ByteLevel" in types
    metaspace = bool(types & {"Metaspace", "Replace"})  # SentencePiece's decoders turn '▁' into ' '
    byte_fallback = "ByteFallback" in types
    alphabet = _byte_level_decoder() if byte_level else {}
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    plain = tokenizer(" a", add_special_tokens=False)["input_ids"]
    framed = tokenizer(" a", add_special_tokens=True)["input_ids"]
    prefix = framed[: len(framed) - len(plain)] if framed[len(framed) - len(plain):] == plain else []

    def text_of(token: str) -> bytes:
        if byte_level:
            if all(c in alphabet for c in token):
                return bytes(alphabet[c] for c in token)
            return token.encode()
        if byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])
        return (token.replace("▁", " ") if metaspace else token).encode()

    texts = [b""] * max(size, len(tokenizer))
    for token, i in tokenizer.get_vocab().items():
        texts[i] = added[i].content.encode() if i in added else text_of(token)
    for i in prefix:
        texts[i] = b""
    special = frozenset(i for i, token in added.items() if token.special)
    return TokenTexts(texts=texts, special=special, prefix=list(prefix))


@dataclass(frozen=True)
class VocabularyMap:
    """The tokens a draft's and a target's vocabularies share: the same bytes (token-level
    intersection, Timor et al., arXiv:2502.05202), special tokens only with special tokens.

    The map is one to one: where one side has several tokens for the same bytes (a
    SentencePiece '▁' and its ``<0x20>`` byte token), the lowest id stands for them, so that a
    draft distribution restricted to ``draft_ids`` is the same distribution over ``target_ids``.

    Attributes:
        draft_ids: ``[S]`` int64 draft token ids, ascending.
        target_ids: ``[S]`` int64 the target's token id for each (``target_ids[i]`` ~ ``draft_ids[i]``).
        target_of_draft: ``[V_d]`` int64 the target id of each draft id, -1 where none.
        target_vocab_size: V_t, the width of the target's logits.
        shared_fraction: the shared text (not special) tokens over the smaller vocabulary's.
        draft: the draft's ``TokenTexts``; target: the target's.
    """

    draft_ids: torch.Tensor
    target_ids: torch.Tensor
    target_of_draft: torch.Tensor
    target_vocab_size: int
    shared_fraction: float
    draft: TokenTexts
    target: TokenTexts

    def __len__(self) -> int:
        return int(self.draft_ids.shape[0])

    def to_target(self, draft_values: torch.Tensor, fill: float) -> torch.Tensor:
        """``[..., V_d]`` draft probabilities or logits -> ``[..., V_t]`` over the target's ids,
        ``fill`` (0 or -inf) at target tokens the draft does not share."""
        out = draft_values.new_full((*draft_values.shape[:-1], self.target_vocab_size), fill)
        out[..., self.target_ids.to(out.device)] = draft_values[..., self.draft_ids.to(out.device)]
        return out


def shared_vocabulary(target: LoadedModel, draft: LoadedModel,
                      min_shared_fraction: float = MIN_SHARED_FRACTION) -> VocabularyMap:
    """The ``VocabularyMap`` of a draft with another tokenizer than the target's.

    Raises:
        TokenizerMismatchError: either model has no tokenizer, or the vocabularies share fewer
            than ``min_shared_fraction`` of the smaller one's tokens (the figure is in the message).
    """
    if target.tokenizer is None or draft.tokenizer is None:
        raise TokenizerMismatchError(
            f"drafting with another tokenizer reads both vocabularies: {target.name!r} or {draft.name!r} "
            "has no tokenizer. Give both models their tokenizer."
        )
    target_texts = token_texts(target.tokenizer, target.vocab_size)
    draft_texts = token_texts(draft.tokenizer, draft.vocab_size)

    def first_ids(texts: TokenTexts, size: int) -> dict[tuple[bool, bytes], int]:
        ids: dict[tuple[bool, bytes], int] = {}
        for i, text in enumerate(texts.texts[:size]):
            if text:  # the lowest id stands for duplicates (the map is one to one)
                ids.setdefault((i in texts.special, text), i)
        return ids

    target_by_text = first_ids(target_texts, target.vocab_size)
    draft_by_text = first_ids(draft_texts, draft.vocab_size)
    pairs = sorted((d, target_by_text[key]) for key, d in draft_by_text.items() if key in target_by_text)
    # The share counts text tokens: a handful of special tokens is no vocabulary.
    shared = sum(not special for special, _ in draft_by_text.keys() & target_by_text.keys())
    smaller = min(sum(not special for special, _ in ids) for ids in (target_by_text, draft_by_text))
    fraction = shared / max(1, smaller)
    if fraction < min_shared_fraction:
        raise TokenizerMismatchError(
            f"the draft {draft.name!r} shares only {shared:,} text tokens with the target {target.name!r}: "
            f"{fraction:.1%} of the smaller vocabulary ({smaller:,} tokens), under the {min_shared_fraction:.0%} "
            "a draft needs, since it can propose only shared tokens. Use a draft whose tokenizer is closer to "
            "the target's (same family, or byte-level BPE for a byte-level BPE target), or prompt lookup "
            "(--draft ngram)."
        )
    draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)
    target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)
    target_of_draft = torch.full((draft.vocab_size,), -1, dtype=torch.long)
    target_of_draft[draft_ids] = target_ids
    return VocabularyMap(draft_ids, target_ids, target_of_draft, target.vocab_size, fraction, draft_texts, target_texts)

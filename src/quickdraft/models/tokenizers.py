"""Checking that a target and a draft speak the same token ids.

Speculation compares the draft's token ids and probabilities with the target's position by
position, so the two must map every token to the same id (identical ``get_vocab()``) and produce
logits of the same width. Equal vocabulary sizes are not enough: two tokenizers of 49,152
tokens can number them differently.
"""

from __future__ import annotations

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

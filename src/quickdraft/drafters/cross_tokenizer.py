"""Drafting with a model of another family: a draft whose tokenizer is not the target's.

**Token-level intersection** (TLI; Timor et al., "Accelerating LLM Inference with Lossless
Speculative Decoding Algorithms for Heterogeneous Vocabularies", arXiv:2502.05202, ICML 2025):
the draft proposes only tokens whose bytes the target's vocabulary also has
(``models.tokenizers.VocabularyMap``). Its logits outside those tokens are -inf, so after the
sampling parameters its distribution q is renormalised over the shared tokens; read over the
target's ids (the map is one to one) it is exactly the distribution the proposed target token
was drawn from, and the ordinary rule (accept with min(1, p/q), resample from
norm(max(0, p - q)), bonus from p) keeps the target's distribution at every temperature, top-k
and top-p.

Greedy drafts (the draft's argmax over the shared tokens) are handed to the target as the
target's own tokenizer spells the drafted text (**string-level exact match**, SLEM, the same
paper; transformers' Universal Assisted Generation): where the target merges what the draft
splits (Qwen's ``):\\n`` against SmolLM2's ``):`` ``\\n``) it gets its own token to accept. Where
the drafted text would merge with the committed text's last tokens, the shared tokens are
proposed as they are. The target verifies its own argmax either way, so greedy output is the
target's own.

The draft reads text, not the target's ids: the committed sequence is decoded to bytes with
the target's vocabulary and encoded with the draft's tokenizer (``DraftTokenView``). Its KV
cache holds draft tokens and rolls back to the longest prefix they share with the new encoding
(``ModelRunner.forward_tail``): the draft tokens it drafted itself are replaced by the
tokenizer's own encoding of the accepted text, which can split it differently.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from itertools import accumulate

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.vocabulary import draft_vocabulary
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import MIN_SHARED_FRACTION, TokenTexts, shared_vocabulary
from quickdraft.processing import LogitsProcessor

# New text is encoded together with the last this many draft tokens before it, since an
# appended character can change how the text before it splits ("Hel" + "lo" -> "Hello").
# Byte-level BPE merges only within a pre-tokenised word, a few tokens at most; a longer word may
# end up split otherwise than in an encoding of the whole text, which changes what the draft
# reads, never the output.
LOOK_BEHIND = 8


def _starts_character(text: bytes | bytearray, offset: int) -> bool:
    """Whether ``offset`` is at a UTF-8 character boundary of ``text`` (not a continuation byte)."""
    return offset >= len(text) or text[offset] & 0xC0 != 0x80


class DraftTokenView:
    """The draft's tokens for the target's committed text, kept up to date as it grows.

    New text is encoded from ``LOOK_BEHIND`` draft tokens back, the tokens before that are kept.
    That is only sound while the draft's tokens spell the text byte for byte (their bytes are
    known, so their offsets are); a tokenizer that does not (an ``<unk>``, a normaliser, a
    SentencePiece dummy-prefix space) is found on the first encoding that differs, and from
    then on the whole text is encoded again at every step (correct, and slower on long texts).

    Bytes the target's tokens leave in the middle of a character wait until it is complete.

    Args:
        tokenizer: the draft's tokenizer.
        draft: the draft vocabulary's ``TokenTexts`` (the ids' bytes, the prefix it adds: BOS).
        target: the target vocabulary's ``TokenTexts``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, draft: TokenTexts, target: TokenTexts) -> None:
        self.tokenizer = tokenizer
        self.draft = draft
        self.target = target
        self.reset([])

    @property
    def pending(self) -> bool:
        """Whether the text ends in bytes of a character not complete yet (the draft does not read them)."""
        return bool(self._decoder.getstate()[0])

    def reset(self, target_ids: Sequence[int]) -> list[int]:
        """Start over with ``target_ids``; returns the draft's ids for them (``update``)."""
        self._target_ids: list[int] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = bytearray()  # UTF-8 of the complete characters so far
        self._ids: list[int] = []  # the draft's tokens for _text (without the prefix)
        self._ends: list[int] = []  # byte offset in _text where each of _ids ends (while faithful)
        self._faithful = True
        return self.update(target_ids)

    def update(self, target_ids: Sequence[int]) -> list[int]:
        """The draft's ids (its prefix, then its encoding of the text) for ``target_ids``, which
        continue the ids of the last call (otherwise the view starts over)."""
        known = len(self._target_ids)
        if list(target_ids[:known]) != self._target_ids:
            return self.reset(target_ids)
        new = [int(t) for t in target_ids[known:]]
        self._target_ids.extend(new)
        chars = self._decoder.decode(b"".join(self.target.texts[t] for t in new))
        if chars:
            self._append(chars.encode())
        return self.draft.prefix + self._ids

    def _append(self, new: bytes) -> None:
        first = max(0, len(self._ids) - LOOK_BEHIND) if self._faithful else 0
        # A byte-level token can end inside a character: re-encode from a character boundary.
        while first > 0 and not _starts_character(self._text, self._ends[first - 1]):
            first -= 1
        start = self._ends[first - 1] if first else 0
        self._text += new
        ids = self._encode(start)
        if self._faithful and b"".join(self.draft.texts[i] for i in ids) != self._text[start:]:
            self._faithful = False
            if start:
                first, start, ids = 0, 0, self._encode(0)
        self._ids[first:] = ids
        if self._faithful:
            self._ends[first:] = [start + n for n in accumulate(len(self.draft.texts[i]) for i in ids)]

    def _encode(self, start: int) -> list[int]:
        text = self._text[start:].decode("utf-8")  # whole characters: start is a boundary
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class CrossTokenizerDrafter(DraftModelDrafter):
    """A draft model with another tokenizer than the target's, drafting the tokens both share
    (token-level intersection; see the module docstring).

    It is a ``DraftModelDrafter`` whose sequence is the draft's own encoding of the text, and whose
    output layer computes only the shared tokens; its drafts are read over the target's ids.

    Args:
        model: the draft model, with its tokenizer.
        target: the target model, with its tokenizer.
        vocabulary_size: if set, the draft proposes only the shared tokens among its
            ``vocabulary_size`` most frequent ones and the prompt's
            (``quickdraft.drafters.vocabulary``).
        context_window: if set, the draft reads the text of the prompt's last ``context_window``
            target tokens (and everything generated after them).
        min_shared_fraction: refuse a draft that shares fewer tokens with the target (a share of
            the smaller vocabulary; ``models.tokenizers.shared_vocabulary``).
    """

    def __init__(self, model: LoadedModel, target: LoadedModel, vocabulary_size: int | None = None,
                 context_window: int | None = None, min_shared_fraction: float = MIN_SHARED_FRACTION) -> None:
        super().__init__(model, vocabulary_size, context_window)
        self.vocabulary = shared_vocabulary(target, model, min_shared_fraction)
        self._view = DraftTokenView(model.tokenizer, self.vocabulary.draft, self.vocabulary.target)
        self._target_tokenizer = target.tokenizer
        self._target_of_draft = self.vocabulary.target_of_draft.to(model.device)  # [V_d]
        # The options that depend on the prefix (penalties, logit bias, structured output) count
        # the target's ids: the draft drafts without them (an inactive processor), and verification
        # applies them, exact all the same (q is what the tokens were drawn from), as Medusa does.
        self._no_options = LogitsProcessor(SamplingParams(), model.vocab_size, ())
        self._text_start = 0  # the first target position whose text the draft reads
        self.rows = self.vocabulary.draft_ids  # [R] the draft ids it proposes for this prompt (``begin``)

    def fork(self) -> CrossTokenizerDrafter:
        """The same model and vocabularies with a cache and a view of the text of its own."""
        twin = super().fork()
        twin._view = DraftTokenView(self.model.tokenizer, self.vocabulary.draft, self.vocabulary.target)
        return twin

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._runner.reset()
        window = self.context_window
        self._text_start = max(0, len(prompt_ids) - window) if window is not None else 0
        context = self._view.reset(prompt_ids[self._text_start:])
        self.rows = self.vocabulary.draft_ids  # [S]
        frequent = draft_vocabulary(self.model, self.vocabulary_size, context)
        if frequent is not None:
            self.rows = self.rows[torch.isin(self.rows, frequent)]
        self._runner.restrict_vocabulary(self.rows)
        if len(context) > 1:
            self._runner.forward(context[:-1])

    def behind(self, sequence: Sequence[int]) -> int:
        """0: the draft reads the prompt's text in ``begin``, where its view of the text is built."""
        return 0

    def context(self, sequence: Sequence[int]) -> list[int]:
        """The draft's token ids for the text of ``sequence`` (target ids), as it reads them."""
        return self._view.update(sequence[self._text_start:])

    def next_logits(self, sequence: Sequence[int]) -> torch.Tensor:
        """``[V_t]`` float32 the draft's logits for the token after ``sequence`` (target ids), over
        the target's ids (-inf where it proposes nothing): what ``propose`` drafts its first token
        from. ``quickdraft doctor`` scores a draft with it."""
        logits = self._runner.forward_tail(self.context(sequence))[-1]  # [V_d]
        return self.vocabulary.to_target(logits.float(), float("-inf"))

    def spelled_by_target(self, sequence: Sequence[int], draft_ids: list[int]) -> list[int] | None:
        """The target tokenizer's tokens for the text of ``draft_ids`` after ``sequence`` (SLEM),
        or None where the boundary does not hold still.

        The drafted text is encoded together with the text of the sequence's last ``LOOK_BEHIND``
        tokens, and kept only if those come out as they are (otherwise the drafted text would
        merge with committed tokens: "c" + "a" committed, "b" drafted, encoded "c" "ab"); a last
        character the draft has not finished is left out.

        Example: committed ``... "(n"``, drafted ``"):" "\\n"`` -> the target's ``"):\\n"``.
        """
        if self._view.pending:  # the draft's text starts before the target's last bytes
            return None
        texts = self.vocabulary.target.texts
        tail = list(sequence[max(self._text_start, len(sequence) - LOOK_BEHIND):])
        # A BOS spells nothing, and a byte-level token can hold the end of a character.
        while tail and not (texts[tail[0]] and _starts_character(texts[tail[0]], 0)):
            tail = tail[1:]
        spelled = b"".join(texts[t] for t in tail) + b"".join(self.vocabulary.draft.texts[d] for d in draft_ids)
        try:
            text = codecs.getincrementaldecoder("utf-8")().decode(spelled)  # whole characters only
        except UnicodeDecodeError:
            return None
        ids = self._target_tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids[: len(tail)] != tail or len(ids) == len(tail):
            return None
        return ids[len(tail):]

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        processor: LogitsProcessor | None = None,
    ) -> Draft:
        context = self.context(sequence)
        if not context:  # no text yet (a prompt of a BOS alone, for a draft that adds none)
            return Draft(tokens=torch.empty(0, dtype=torch.long))
        # Draft ids, and q over the draft's ids: zero outside the shared tokens, so renormalised
        # over them. The draft's own sequence starts at 0: the window is cut in target positions.
        draft = super().propose(context, k, params, generator, self._no_options)
        if params.greedy:
            spelled = self.spelled_by_target(sequence, draft.tokens.tolist())
            if spelled is not None:
                return Draft(tokens=torch.tensor(spelled[:k], dtype=torch.long))
        return Draft(
            tokens=self._target_of_draft[draft.tokens],  # [k] target ids
            probs=None if draft.probs is None else self.vocabulary.to_target(draft.probs, 0.0),  # [k, V_t]
        )

"""The drafter registry: one function turns a draft spec and the target into a drafter.

A spec is ``None`` or ``"none"`` (plain decoding), a ``LoadedModel`` (a draft model), a string
naming a kind (``"ngram"``, ``"eagle:DIR"``, ``"medusa:DIR"``: ``KIND`` or ``KIND:ARGUMENT``) or
any ``Drafter``. The defaults of each kind and the check of a draft model's tokenizer live here.

A new kind is one module with a ``Drafter`` class and a ``build(argument, target, tree)``
function, and one line in ``KINDS`` (docs/drafters.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.drafters import eagle, medusa, suffix_cache
from quickdraft.drafters import prompt_lookup as ngram
from quickdraft.drafters.base import Drafter
from quickdraft.drafters.cross_tokenizer import CrossTokenizerDrafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.lookup_first import Lookup, PromptLookupFirst
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.suffix_cache import SuffixCacheStore, SuffixDrafter
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import shares_token_ids
from quickdraft.tree import TreeSpec

# A draft model with a larger vocabulary drafts over this many most frequent tokens (plus the
# prompt's): on the Qwen2.5 pair it cut the draft step by about a fifth for a few points of
# acceptance on prose (docs/performance.md).
DEFAULT_DRAFT_VOCABULARY = 32768
# A draft model reads only the prompt's last this many tokens: its prefill of a long prompt
# (summaries, retrieved documents) added a third to the target's, which put the default behind
# prompt lookup alone on summaries (docs/performance.md); prompt lookup sees the whole prompt.
DEFAULT_DRAFT_CONTEXT_WINDOW = 256

Spec = LoadedModel | Drafter | str | None

# Targets with a known smaller sibling that shares their tokenizer: the draft model drafts for
# them unless told otherwise. Any other target drafts with prompt lookup, which needs no model.
DEFAULT_DRAFT_MODELS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}


@dataclass(frozen=True)
class Kind:
    """A drafter kind named by a string spec.

    Attributes:
        build: ``build(argument, target, tree)``: the drafter for ``"KIND:ARGUMENT"`` ("" when
            the spec is the bare name); raises ``InvalidParameterError`` on a tree it cannot draft.
        lookup_first: whether prompt lookup stands in front of it unless told otherwise (a
            drafter that runs a model gains from a free copy; prompt lookup is one already).
    """

    build: Callable[[str, LoadedModel, TreeSpec | None], Drafter]
    lookup_first: bool


KINDS: dict[str, Kind] = {
    "ngram": Kind(ngram.build, lookup_first=False),
    "suffix": Kind(suffix_cache.build, lookup_first=False),
    "eagle": Kind(eagle.build, lookup_first=True),
    "medusa": Kind(medusa.build, lookup_first=True),
}


def draft_vocabulary_size(draft: LoadedModel) -> int | None:
    """How many of its most frequent tokens a draft model drafts over by default (None: all)."""
    return DEFAULT_DRAFT_VOCABULARY if draft.vocab_size > 2 * DEFAULT_DRAFT_VOCABULARY else None


def default_draft(target: str) -> tuple[str, str]:
    """The draft spec for a target named ``target`` (as ``--target`` takes it) when none is
    given, and one line saying what was chosen and why."""
    name = target.rstrip("/").rsplit("/", 1)[-1].lower()
    if name in DEFAULT_DRAFT_MODELS:
        draft = DEFAULT_DRAFT_MODELS[name]
        return draft, f"draft: {draft}, the smaller sibling of {name} (--draft to change)"
    return "ngram", (f"draft: ngram (prompt lookup): no smaller sibling of {target} is known "
                     "(--draft MODEL to draft with a model)")


def names_a_kind(spec: str) -> bool:
    """Whether a string spec names a kind (or plain decoding) rather than a model to load."""
    return spec == "none" or spec.partition(":")[0] in KINDS


def draft_model_drafter(draft: LoadedModel, target: LoadedModel, tree: TreeSpec | None) -> Drafter:
    """A draft model's drafter with the defaults: the tokens both vocabularies share when its
    tokenizer is not the target's (docs/cross_tokenizer.md), chains or ``tree`` otherwise."""
    vocabulary = draft_vocabulary_size(draft)
    if not shares_token_ids(target, draft):
        if tree is not None:
            raise InvalidParameterError(
                f"{draft.name} has another tokenizer than {target.name}: it drafts chains only (no tree=)"
            )
        return CrossTokenizerDrafter(draft, target, vocabulary, DEFAULT_DRAFT_CONTEXT_WINDOW)
    return DraftModelDrafter(draft, vocabulary, DEFAULT_DRAFT_CONTEXT_WINDOW, tree)


def make_drafter(
    spec: Spec, target: LoadedModel, tree: TreeSpec | None = None, prompt_lookup: bool | None = None,
    lookup: Lookup | None = None,
) -> Drafter | None:
    """The drafter of ``spec`` for ``target`` (None: plain decoding).

    Args:
        spec: see the module docstring.
        tree: draft trees of this shape (a draft model, ``"ngram"``, ``"eagle:DIR"``).
        prompt_lookup: put prompt lookup in front (``PromptLookupFirst``); default: for a draft
            model and the kinds whose ``lookup_first`` is set, not for custom drafters.
        lookup: what stands in front where prompt lookup does (default ``PromptLookupDrafter``;
            a ``SuffixDrafter`` adds earlier requests' text).
    """
    if spec is None or spec == "none":
        if tree is not None:
            raise InvalidParameterError("tree= applies to a draft: plain decoding has no drafts")
        if prompt_lookup:
            raise InvalidParameterError("prompt_lookup=True applies before a drafter: with draft=None there is none")
        return None
    if isinstance(spec, LoadedModel):
        drafter, lookup_first = draft_model_drafter(spec, target, tree), True
    elif isinstance(spec, str):
        name, _, argument = spec.partition(":")
        if name not in KINDS:
            raise _unknown(spec)
        drafter, lookup_first = KINDS[name].build(argument, target, tree), KINDS[name].lookup_first
        if prompt_lookup and isinstance(drafter, (ngram.PromptLookupDrafter, SuffixDrafter)):
            raise InvalidParameterError(
                "prompt_lookup=True applies before a draft model, a trained head or a custom drafter: "
                f"with draft={spec!r} there is nothing for it to stand in front of"
            )
    elif isinstance(spec, Drafter):
        if tree is not None:
            raise InvalidParameterError(
                "tree= applies to a draft model, 'ngram' or 'eagle:DIR': a custom Drafter returns its own "
                "trees (Draft.parents)"
            )
        drafter, lookup_first = spec, False
    else:
        raise _unknown(spec)
    if prompt_lookup if prompt_lookup is not None else lookup_first:
        return PromptLookupFirst(drafter, lookup)
    return drafter



def batch_form(drafter: Drafter | None) -> tuple[LoadedModel | Drafter | None, Lookup | None]:
    """What ``BatchEngine`` drafts with for a ``SpeculativeDecoder``'s drafter, and the lookup in
    front (forked per row): a draft model sharing the target's tokens drafts in one batched
    forward per drafted position, prompt lookup and the suffix cache as every row's lookup; every
    other drafter drafts row by row (``RowDrafters``)."""
    lookup = drafter.lookup if isinstance(drafter, PromptLookupFirst) else None
    inner = drafter.inner if isinstance(drafter, PromptLookupFirst) else drafter
    if (type(inner) is PromptLookupDrafter and inner.tree is None) or type(inner) is SuffixDrafter:
        return None, inner
    if type(inner) is DraftModelDrafter and inner.spec is None:
        return inner.model, lookup
    return inner, lookup


def suffix_store(drafter: Drafter | None) -> SuffixCacheStore | None:
    """The suffix cache ``drafter`` drafts from (alone or in front of another), None if none."""
    front = drafter.lookup if isinstance(drafter, PromptLookupFirst) else drafter
    return front.store if isinstance(front, SuffixDrafter) else None


def _unknown(spec: object) -> InvalidParameterError:
    return InvalidParameterError(
        f"draft must be a loaded model, a Drafter, None or one of {', '.join(repr(k) for k in KINDS)} "
        f"(KIND:ARGUMENT where the kind takes one, as 'eagle:DIR'), got {spec!r}"
    )

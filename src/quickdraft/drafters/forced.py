"""The tokens a grammar forces, drafted first and for free, in front of any drafter.

With structured output many tokens of the output are no choice at all (a JSON schema's keys,
quotes, braces, fixed enum text): ``LogitsProcessor.forced_tokens`` gives them. Both engines
draft them first, at no cost, in front of either draft the policy chooses between:

* the free copy (``free_copy``): the forced tokens, then the lookup's copy after them (prompt
  lookup, the suffix cache), or the forced tokens alone. The policy weighs it as any lookup
  copy (``lookup_tokens``, ``RowOutlook.cap``) and learns its acceptance as the lookup's, so
  that where the drafter does not pay, the forced tokens are still drafted where verifying
  them does;
* the drafter's draft (``after_forced``): the forced tokens, then the drafter's own tokens,
  drafted from the sequence followed by them, its rows processed as the rows after them
  (``LogitsProcessor.after``). The drafter's acceptance counts the forced tokens with its own:
  they are the step's draft, at their acceptance.

A seeded sampled request follows the seed rule (``quickdraft.engine.SEEDED_RULE``), where a
copy is taken whenever there is one: its forced tokens alone are no copy (``alone=False``),
they go in front of the drafter's k, in both engines alike.

Either way they count towards the step's k: the draft length limit, ``max_new_tokens`` and
the context window hold as for any draft. Verification treats them as a draft with one-hot q,
which keeps the output the constrained target's exactly; they are usually, not always,
accepted (the grammar allows every tokenization of the forced bytes, and the target may
prefer another). ``DecodeStats.grammar_tokens`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from quickdraft.drafters.base import Draft
from quickdraft.processing import LogitsProcessor


def free_copy(
    processor: LogitsProcessor, sequence: Sequence[int], cap: int,
    lookup: Callable[[list[int], int], list[int]] | None, alone: bool = True,
) -> tuple[list[int], list[int]]:
    """The forced tokens after ``sequence`` (at most ``cap``), and the free copy: those, then
    what ``lookup(sequence + forced, n)`` copies after them (at most ``cap`` in all). Where the
    lookup has nothing to add, the forced tokens alone are the copy if ``alone``, else there
    is no copy ([]: they go in front of the drafter's draft)."""
    forced = processor.forced_tokens(cap)
    left = cap - len(forced)
    rest = lookup(list(sequence) + forced, left) if lookup is not None and left > 0 else []
    return forced, (forced + list(rest) if rest or alone else [])


def after_forced(forced: Sequence[int], draft: Draft) -> Draft:
    """``forced`` then ``draft`` (drafted after them), on the draft's device: the forced tokens'
    q rows one-hot where the draft has a q, a tree's roots hung from the last forced token.

    Example: forced ``[7, 8]``, a tree with parents ``[-1, -1, 0]`` -> parents ``[-1, 0, 1, 1, 2]``.
    """
    n = len(forced)
    if not n:
        return draft
    device = draft.tokens.device
    head = torch.tensor(list(forced), dtype=torch.long, device=device)  # [n]
    probs = draft.probs
    if probs is not None:
        one_hot = torch.zeros(n, probs.shape[1], dtype=probs.dtype, device=probs.device)  # [n, V]
        one_hot[torch.arange(n), head.to(probs.device)] = 1.0
        probs = torch.cat([one_hot, probs])  # [n + k, V]
    parents = draft.parents
    if parents is not None:
        chain = torch.arange(-1, n - 1, dtype=parents.dtype, device=parents.device)
        parents = torch.cat([chain, torch.where(parents >= 0, parents + n, n - 1)])  # [n + N]
    return Draft(tokens=torch.cat([head, draft.tokens]), probs=probs, parents=parents)

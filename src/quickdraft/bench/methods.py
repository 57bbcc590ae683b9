"""The decoding methods a benchmark compares, behind one small Protocol.

Every method turns prompt ids, sampling parameters and K into exactly
``params.max_new_tokens`` new tokens (end-of-sequence tokens do not stop it), so tokens per
second compare like for like. The runner never branches on a method's name: a new drafter in
the engine is one more ``EngineMethod`` entry in ``build_methods``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from quickdraft.bench.generation import Generation, Method
from quickdraft.bench.peer import TransformersMethod
from quickdraft.config import SamplingParams
from quickdraft.drafters.head_checkpoint import read_head_config
from quickdraft.engine import SpeculativeDecoder
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.models.packing import has_packed_layers
from quickdraft.models.tokenizers import shares_token_ids
from quickdraft.policy import FixedK
from quickdraft.tree import DEFAULT_BRANCH, TreeSpec

# Nodes of the benchmark's trees unless --tree-budget says otherwise: 16 cover the draft's
# second choices at the first depths; which budget pays on a machine is what `quickdraft
# doctor` predicts (docs/trees.md).
DEFAULT_TREE_BUDGET = 16


class EngineMethod:
    """quickdraft's ``SpeculativeDecoder``, built for each K by ``make_decoder(k)``.

    The decoder is built once per K and kept, so a policy that learns (``AdaptiveK``) learns
    across prompts, as it would in a server. ``plain`` marks a decoder that drafts nothing.
    """

    family = "quickdraft"

    def __init__(self, name: str, description: str, make_decoder: Callable[[int], SpeculativeDecoder],
                 plain: bool = False) -> None:
        self.name = name
        self.description = description
        self.plain = plain
        self._make_decoder = make_decoder
        self._decoders: dict[int, SpeculativeDecoder] = {}

    def generate(self, prompt_ids: list[int], params: SamplingParams, k: int) -> Generation:
        k = 1 if self.plain else k  # K means nothing without a draft: one decoder serves all
        if k not in self._decoders:
            self._decoders[k] = self._make_decoder(k)
        out = self._decoders[k].generate(prompt_ids, replace(params, ignore_eos=True))
        return Generation(out.token_ids, out.stats)


def plain_method(name: str, target: LoadedModel) -> EngineMethod:
    """quickdraft's plain decoding of ``target``: the reference path, and a candidate baseline."""
    packed = ", packed weights" if has_packed_layers(target) else ""
    return EngineMethod(name, f"quickdraft, target alone ({target.precision}{packed}), the reference path",
                        lambda k: SpeculativeDecoder(target, None), plain=True)


def build_methods(
    target: LoadedModel,
    draft: LoadedModel | None,
    names: Sequence[str] | None = None,
    peer: bool = True,
    eagle: str | None = None,
    peer_models: tuple[LoadedModel, LoadedModel | None] | None = None,
    medusa: str | None = None,
    tree_budget: int = DEFAULT_TREE_BUDGET,
    tree_branch: int = DEFAULT_BRANCH,
) -> list[Method]:
    """The methods to compare, in the order of ``names``.

    ``names=None`` takes those of ``DEFAULT_METHODS`` that are available; ``["all"]`` takes
    every method available. ``draft`` is the draft model (``None``: the methods that need one
    are left out). ``peer`` adds transformers' own decoding, on ``peer_models`` (target, draft)
    when given (stock layers: what transformers users run), else on the same model objects.
    ``eagle`` is the folder of an EAGLE head trained for ``target`` (``None``: no eagle method),
    ``medusa`` that of Medusa heads (K fixed means K or the number of heads, whichever is less).
    The tree methods draft ``TreeSpec(budget=tree_budget, depth=K, branch=tree_branch)``.
    """
    # The single-drafter methods leave out the prompt-lookup stage, so that each shows its own drafter.
    def fixed_k(drafter: object) -> Callable[[int], SpeculativeDecoder]:
        return lambda k: SpeculativeDecoder(target, drafter, num_speculative_tokens=k, policy=FixedK(k),
                                            prompt_lookup=False)

    def adaptive(drafter: object) -> Callable[[int], SpeculativeDecoder]:
        return lambda k: SpeculativeDecoder(target, drafter, num_speculative_tokens=k, prompt_lookup=False)

    def shape(k: int) -> TreeSpec:
        return TreeSpec(budget=tree_budget, depth=k, branch=tree_branch)

    def tree(drafter: object) -> Callable[[int], SpeculativeDecoder]:
        return lambda k: SpeculativeDecoder(target, drafter, tree=shape(k), policy=FixedK(k), prompt_lookup=False)

    trees = f"a dynamic tree of {tree_budget} nodes, branch {tree_branch}"

    # One entry per method: a new drafter or policy of the engine is one more line here.
    methods: list[Method] = [plain_method("plain", target)]
    # A draft with another tokenizer drafts chains of the tokens both vocabularies share
    # (docs/cross_tokenizer.md): no tree methods, and transformers' assisted generation would
    # need its own tokenizer arguments (Universal Assisted Generation), so no hf-assisted.
    cross = draft is not None and not shares_token_ids(target, draft)
    if draft is not None:
        drafter = f"draft model {draft.name}" + (" (another tokenizer: the tokens both share)" if cross else "")
        methods += [
            EngineMethod("draft", f"quickdraft, {drafter}, K fixed", fixed_k(draft)),
            EngineMethod("default", f"quickdraft's defaults, SpeculativeDecoder(target, draft): prompt lookup "
                         f"where the context has a match, else {drafter} with AdaptiveK",
                         lambda k: SpeculativeDecoder(target, draft, num_speculative_tokens=k)),
            EngineMethod("draft-adaptive", f"quickdraft, {drafter} alone, the library's default "
                         "policy (AdaptiveK, at most K)", adaptive(draft)),
        ]
    if draft is not None and not cross:
        methods += [
            EngineMethod("tree", f"quickdraft, draft model {draft.name}, {trees}, K deep (EAGLE-2 style)",
                         tree(draft)),
            EngineMethod("default-tree", f"quickdraft's defaults with a tree: prompt lookup where the context has "
                         f"a match, else draft model {draft.name} growing {trees}, its depth capped by AdaptiveK",
                         lambda k: SpeculativeDecoder(target, draft, tree=shape(k))),
        ]
    def head_method(name: str, description: str, spec: str, fixed: bool, tree: bool = False) -> EngineMethod:
        # Each decoder builds its own drafter: a head's drafter holds its sequence's state.
        return EngineMethod(name, description, lambda k: SpeculativeDecoder(
            target, spec, num_speculative_tokens=k, policy=FixedK(k) if fixed else None,
            tree=shape(k) if tree else None, prompt_lookup=False))

    if eagle is not None:
        methods += [
            head_method("eagle", f"quickdraft, EAGLE head {eagle}, K fixed", f"eagle:{eagle}", True),
            head_method("eagle-adaptive", f"quickdraft, EAGLE head {eagle} alone, the library's default policy "
                        "(AdaptiveK, at most K)", f"eagle:{eagle}", False),
            head_method("eagle-tree", f"quickdraft, EAGLE head {eagle}, {trees}, K deep (EAGLE-2)",
                        f"eagle:{eagle}", True, tree=True),
        ]
    if medusa is not None:
        heads = read_head_config(medusa)["heads"]
        methods += [
            head_method("medusa", f"quickdraft, {heads} Medusa heads {medusa}, K fixed (at most the heads)",
                        f"medusa:{medusa}", True),
            head_method("medusa-adaptive", f"quickdraft, {heads} Medusa heads {medusa} alone, the library's "
                        "default policy (AdaptiveK, at most K)", f"medusa:{medusa}", False),
        ]
    methods += [
        EngineMethod("ngram", "quickdraft, prompt lookup (n-gram), K fixed", fixed_k("ngram")),
        EngineMethod("ngram-adaptive", "quickdraft, prompt lookup, the library's default policy",
                     adaptive("ngram")),
    ]
    if peer:
        # Not ``target, draft = ...``: the engine methods' lambdas above read those names when called.
        peer_target, peer_draft = peer_models or (target, draft)
        methods.append(TransformersMethod("hf-plain", peer_target, "transformers generate(), target alone"))
        if peer_draft is not None and not cross:
            methods.append(TransformersMethod(
                "hf-assisted", peer_target,
                "transformers generate(assistant_model=draft), its defaults (up to 20 draft tokens, "
                "stop drafting below 0.4 confidence)",
                assistant=peer_draft))
            methods.append(TransformersMethod(
                "hf-assisted-k", peer_target,
                "transformers generate(assistant_model=draft), K fixed (constant schedule, no confidence stop)",
                assistant=peer_draft, fixed_k=True))
        methods.append(TransformersMethod(
            "hf-ngram", peer_target, "transformers generate(prompt_lookup_num_tokens=K)", prompt_lookup=True))
    if names is None:
        return [m for m in methods if m.name in DEFAULT_METHODS]
    if list(names) == ["all"]:
        return methods
    by_name = {m.name: m for m in methods}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidParameterError(
            f"unknown or unavailable method(s) {', '.join(unknown)}; available here: {', '.join(by_name)}"
        )
    return [by_name[n] for n in names]


# What a run compares unless --methods says otherwise: the brief's set, one entry per idea.
DEFAULT_METHODS = ("plain", "default", "draft", "draft-adaptive", "tree", "eagle", "eagle-adaptive", "eagle-tree",
                   "medusa", "medusa-adaptive",
                   "ngram", "hf-plain", "hf-assisted", "hf-ngram")

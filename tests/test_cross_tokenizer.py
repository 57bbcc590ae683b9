"""Drafts with another tokenizer (token-level intersection, docs/cross_tokenizer.md).

Tiny random models over two hand-made vocabularies that differ the ways real ones do:

    target:  </s>  a  b  c  d  " "  ab  " a"              (8 tokens)
    draft:   <unk>  <s>  </s>  " "  c  b  a  ca  bc  " a"  (10 tokens; BOS <s> before every text)

shared by their text: ``</s>`` (special on both sides), ``a b c " " " a"``; merged on one side
and split on the other: ``ab`` (target), ``ca`` (draft); only one side has: ``d`` (the draft
reads it as ``<unk>``), ``bc``. Continuations of 3 tokens over the target's 8 give 512 cells,
whose exact probabilities are enumerated (``enumeration.exact_outcomes``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import char_tokenizer, make_tiny_model
from enumeration import exact_outcomes, outcome_p_value, sampled_outcomes
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder, TokenizerMismatchError
from quickdraft.bench.doctor import DoctorConfig, DoctorPrompt, diagnose, format_report
from quickdraft.drafters import CrossTokenizerDrafter, Draft
from quickdraft.drafters.cross_tokenizer import DraftTokenView
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import shared_vocabulary, token_texts
from quickdraft.sampling import logits_to_probs, sample
from quickdraft.tree import TreeSpec

TARGET_TOKENS = ["</s>", "a", "b", "c", "d", " ", "ab", " a"]
TARGET_MERGES = [("a", "b"), (" ", "a")]
DRAFT_TOKENS = ["<unk>", "<s>", "</s>", " ", "c", "b", "a", "ca", "bc", " a"]
DRAFT_MERGES = [("c", "a"), ("b", "c"), (" ", "a")]
PROMPTS = ["ab c", "cab a", "d ca b"]
PROMPT = "cab a"  # of the sampling tests
LENGTH = 3
SAMPLES = 2000


def bpe_tokenizer(tokens: list[str], merges: list[tuple[str, str]], bos: str | None = None):
    """A BPE tokenizer over ``tokens`` (no pre-tokenizer: spaces are characters), ``</s>`` special,
    ``<unk>`` for characters it lacks if it has that token, and ``bos`` put before every text."""
    from tokenizers import Tokenizer, decoders, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(tokens)}
    unk = "<unk>" if "<unk>" in vocab else None
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=unk))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([t for t in ("<unk>", "<s>", "</s>") if t in vocab])
    if bos is not None:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, unk_token=unk)


def with_tokenizer(tokens: list[str], merges: list[tuple[str, str]], seed: int, name: str,
                   bos: str | None = None) -> LoadedModel:
    tokenizer = bpe_tokenizer(tokens, merges, bos)
    module = make_tiny_model(seed=seed, vocab_size=len(tokens)).module
    return LoadedModel(module=module, tokenizer=tokenizer, name=name)


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    """The target, and the target read through the draft's vocabulary (``read_through``): its
    drafts are accepted where the tokenizers split the text alike, rejected elsewhere."""
    target = with_tokenizer(TARGET_TOKENS, TARGET_MERGES, seed=1, name="tiny-target")
    draft = with_tokenizer(DRAFT_TOKENS, DRAFT_MERGES, seed=2, name="tiny-draft", bos="<s>")
    read_through(draft, target, DRAFT_TOKENS, TARGET_TOKENS)
    return target, draft


def read_through(draft: LoadedModel, target: LoadedModel, draft_tokens: list[str], target_tokens: list[str]) -> None:
    """Make ``draft`` the target read through the draft's vocabulary: the target's layers, and its
    embedding and output rows for the tokens both have (the draft's own random rows for the
    others). It agrees with the target wherever the two tokenizers split the text alike."""
    state = {name: value for name, value in target.module.state_dict().items()
             if not name.startswith(("model.embed_tokens", "lm_head"))}
    draft.module.load_state_dict(state, strict=False)
    with torch.no_grad():
        for d, token in enumerate(draft_tokens):
            if token in target_tokens:
                t = target_tokens.index(token)
                draft.module.model.embed_tokens.weight[d] = target.module.model.embed_tokens.weight[t]
                draft.module.lm_head.weight[d] = target.module.lm_head.weight[t]


@pytest.fixture(scope="module")
def twin() -> tuple[LoadedModel, LoadedModel]:
    """The target over the characters ``abcd `` and a draft that is the target with its tokens
    numbered in another order (``dcba ``): another vocabulary, the same model."""
    target_tokenizer, draft_tokenizer = char_tokenizer("abcd "), char_tokenizer("dcba ")
    target = LoadedModel(make_tiny_model(seed=5, vocab_size=len(target_tokenizer)).module, target_tokenizer, "abcd")
    draft = LoadedModel(make_tiny_model(seed=6, vocab_size=len(draft_tokenizer)).module, draft_tokenizer, "dcba")
    read_through(draft, target, draft_tokenizer.convert_ids_to_tokens(list(range(len(draft_tokenizer)))),
                 target_tokenizer.convert_ids_to_tokens(list(range(len(target_tokenizer)))))
    return target, draft


def byte_level_tokenizer(corpus: list[str], size: int):
    """A byte-level BPE tokenizer (GPT-2's byte alphabet, 'Ġ' for a space) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|end|>"], show_progress=False)
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


# ---- the vocabulary map -----------------------------------------------------------------------


def test_the_map_pairs_the_tokens_that_stand_for_the_same_text(pair):
    target, draft = pair
    vocabulary = shared_vocabulary(target, draft)
    pairs = {DRAFT_TOKENS[d]: TARGET_TOKENS[t] for d, t in zip(vocabulary.draft_ids.tolist(), vocabulary.target_ids.tolist())}
    assert pairs == {t: t for t in ("</s>", "a", "b", "c", " ", " a")}
    assert vocabulary.shared_fraction == 5 / 7  # text tokens: the target's 7 (and the draft's 7)
    assert vocabulary.draft.prefix == [DRAFT_TOKENS.index("<s>")] and vocabulary.target.prefix == []
    assert vocabulary.target_of_draft[DRAFT_TOKENS.index("ca")] == -1
    q = torch.rand(len(DRAFT_TOKENS))
    mapped = vocabulary.to_target(q, 0.0)  # [8]
    assert mapped[TARGET_TOKENS.index(" a")] == q[DRAFT_TOKENS.index(" a")]
    assert mapped[TARGET_TOKENS.index("ab")] == 0 and mapped[TARGET_TOKENS.index("d")] == 0


def test_token_bytes_follow_the_decoder_byte_level_and_sentencepiece():
    byte_level = byte_level_tokenizer(["hello world", "héllo"], 270)
    texts = token_texts(byte_level, len(byte_level))
    assert texts.texts[byte_level.convert_tokens_to_ids("Ġ")] == b" "
    assert texts.texts[byte_level.convert_tokens_to_ids("Ã")] == b"\xc3"  # half of 'é'
    assert texts.texts[byte_level.convert_tokens_to_ids("<|end|>")] == b"<|end|>"
    assert texts.special == {byte_level.convert_tokens_to_ids("<|end|>")}

    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    pieces = ["<0xC3>", "<0xA9>", "▁a", "a", "▁"]
    backend = Tokenizer(BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[("▁", "a")]))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    sentencepiece = token_texts(PreTrainedTokenizerFast(tokenizer_object=backend), len(pieces))
    assert sentencepiece.texts == [b"\xc3", b"\xa9", b" a", b"a", b" "]


def test_a_draft_that_shares_too_little_is_refused_with_the_figure():
    target = with_tokenizer(TARGET_TOKENS, TARGET_MERGES, seed=1, name="tiny-target")
    other = with_tokenizer(["<unk>", "</s>", "x", "y", "z", "w", "v", "a"], [], seed=3, name="other-script")
    with pytest.raises(TokenizerMismatchError, match=r"shares only 1 text tokens .* 16\.7% of the smaller vocabulary"):
        SpeculativeDecoder(target, other)
    near = with_tokenizer(["<unk>", "</s>", "a", "b", "c", "x", "y", "z"], [], seed=3, name="near")  # shares 3 of 6
    assert isinstance(SpeculativeDecoder(target, near).drafter.inner, CrossTokenizerDrafter)
    with pytest.raises(TokenizerMismatchError, match=r"shares only 3 text tokens .* 50\.0% .* under the 60%"):
        CrossTokenizerDrafter(near, target, min_shared_fraction=0.6)


def test_a_draft_with_another_tokenizer_drafts_chains_only(pair):
    target, draft = pair
    with pytest.raises(InvalidParameterError, match="chains only"):
        SpeculativeDecoder(target, draft, tree=TreeSpec(budget=4, depth=2))


# ---- the draft's view of the text ------------------------------------------------------------


@pytest.mark.parametrize("draft_corpus", [
    # Byte-level, new text re-encoded with a look-behind: 'ï', 'é' and '🙂' in single bytes, so
    # that the look-behind can start in the middle of a character (it must not).
    ["the cat sat on the mat", "naive cafe done"],
    None,  # the tiny BPE draft, which reads 'd' and 'é' as <unk>: the whole text is re-encoded
])
def test_the_draft_reads_the_committed_text_as_its_tokenizer_encodes_it(draft_corpus):
    text = "the naïve cat sat on the café mat 🙂 dab"
    target_tokenizer = byte_level_tokenizer(["the cat sat", "mat café"], 262)  # splits 'ï', '🙂' into bytes
    draft_tokenizer = (byte_level_tokenizer(draft_corpus, 300) if draft_corpus
                       else bpe_tokenizer(DRAFT_TOKENS, DRAFT_MERGES, bos="<s>"))
    target_texts = token_texts(target_tokenizer, len(target_tokenizer))
    view = DraftTokenView(draft_tokenizer, token_texts(draft_tokenizer, len(draft_tokenizer)), target_texts)
    target_ids = target_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(target_ids) > len(text.split())  # words come in several tokens, characters in parts
    view.reset(target_ids[:3])

    def encoded(n: int) -> list[int]:  # the draft's encoding of the whole characters of target_ids[:n]
        committed = b"".join(target_texts.texts[t] for t in target_ids[:n]).decode("utf-8", errors="ignore")
        return draft_tokenizer(committed, add_special_tokens=True)["input_ids"]

    for n in range(4, len(target_ids) + 1):
        assert view.update(target_ids[:n]) == encoded(n), n
    assert view.update(target_ids[:2]) == encoded(2)  # not a continuation: starts over


# ---- exactness --------------------------------------------------------------------------------


def test_greedy_drafts_are_spelled_as_the_target_spells_the_text(pair):
    target, draft = pair
    t, d = TARGET_TOKENS.index, DRAFT_TOKENS.index
    drafter = CrossTokenizerDrafter(draft, target)
    drafter.begin([t("c")])
    assert drafter.spelled_by_target([t("c")], [d("a"), d("b")]) == [t("ab")]  # a token the draft does not have
    assert drafter.spelled_by_target([t("c"), t(" ")], [d("c")]) == [t("c")]
    # The drafted text would merge with the committed text ("c" "a" + "b" -> "c" "ab"; " " + "a" -> " a"):
    # the shared tokens are proposed as they are.
    assert drafter.spelled_by_target([t("c"), t("a")], [d("b")]) is None
    assert drafter.spelled_by_target([t("c"), t("a")], [d("b"), d("c")]) is None  # not [c]: the b is in "ab"
    assert drafter.spelled_by_target([t("c"), t(" ")], [d("a")]) is None
    drafter.begin([t("c")])
    greedy = drafter.propose([t("c"), t(" ")], 2, SamplingParams(), None)  # [2] target ids
    assert greedy.probs is None and 1 <= len(greedy) <= 2


def test_greedy_output_is_the_targets_own(pair):
    target, draft = pair
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    plain = SpeculativeDecoder(target, None)
    fixed = SpeculativeDecoder(target, draft, num_speculative_tokens=3, policy=FixedK(3), prompt_lookup=False)
    default = SpeculativeDecoder(target, draft, num_speculative_tokens=3)  # prompt lookup in front, adaptive K
    assert isinstance(fixed.drafter, CrossTokenizerDrafter)
    for prompt in PROMPTS:
        expected = plain.generate(prompt, params).token_ids
        out = fixed.generate(prompt, params)
        assert out.token_ids == expected, prompt
        assert out.stats.draft_forwards > 0 and out.stats.accepted_tokens > 0
        assert default.generate(prompt, params).token_ids == expected, prompt
        # The draft's cache holds tokens of the text's own encoding: rolled back past its drafts.
        drafter = fixed.drafter
        context = drafter.context(target.tokenizer(prompt)["input_ids"] + out.token_ids)
        assert context[: len(drafter._runner.cached_ids)] == drafter._runner.cached_ids


def test_the_target_renumbered_drafts_tokens_that_are_all_accepted(twin):
    target, draft = twin
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=4, policy=FixedK(4), prompt_lookup=False)
    out = decoder.generate("ab cd", params)
    assert out.token_ids == SpeculativeDecoder(target, None).generate("ab cd", params).token_ids
    assert out.stats.accepted_tokens == out.stats.drafted_tokens == 16  # 4 steps of 4 drafts and a bonus token


def test_the_doctor_measures_a_draft_with_another_tokenizer(twin):
    target, draft = twin
    config = DoctorConfig(context=256, max_new_tokens=8, temperatures=(0.0, 0.7), max_k=4, repeats=1)
    prompts = [DoctorPrompt("code", (2, 3, 4, 5)), DoctorPrompt("prose", (6, 3, 2))]
    report = diagnose(target, draft, config, prompts)
    assert report["usable"] and report["tokenizers"]["shared_tokens"] == len(target.tokenizer)
    # The same model: the same argmax, and q = p up to the bfloat16 rows a restricted output layer
    # computes with on a CPU with bfloat16 kernels (``runner.OutputRows``).
    acceptance = report["acceptance"]["by_temperature"]
    assert acceptance[0.0]["all"] == 1.0 and acceptance[0.7]["all"] == pytest.approx(1.0, abs=0.01)
    assert report["costs"]["c"] > 0 and "tree_predictions" not in report
    assert "different vocabularies sharing 7 tokens (100% of the smaller one)" in format_report(report)


def test_the_benchmark_compares_a_draft_with_another_tokenizer_in_chains(pair):
    from quickdraft.bench.methods import build_methods

    target, draft = pair
    methods = build_methods(target, draft, ["all"], peer=True)
    names = [m.name for m in methods]
    assert {"draft", "default", "draft-adaptive"} <= set(names)
    assert not {"tree", "default-tree", "hf-assisted", "hf-assisted-k"} & set(names), names
    method = methods[names.index("draft")]
    assert "another tokenizer" in method.description
    out = method.generate(target.tokenizer("ab c")["input_ids"], SamplingParams(max_new_tokens=6), k=3)
    assert len(out.token_ids) == 6 and out.stats.draft_forwards > 0


def sampling_p_value(decoder: SpeculativeDecoder, params: SamplingParams) -> float:
    """Chi-square p-value of SAMPLES seeded continuations of PROMPT against the target's exact ones."""
    prompt = decoder.target.tokenizer(PROMPT)["input_ids"]
    counts = sampled_outcomes(decoder, prompt, lambda seed: replace(params, seed=seed), SAMPLES)
    return outcome_p_value(counts, exact_outcomes(decoder.target, prompt, params))


CASES = [
    # sampling options, K, prompt lookup before the draft
    (dict(temperature=1.0), 2, False),
    (dict(temperature=0.7, top_p=0.8), 2, True),
    (dict(temperature=1.3, top_k=3, top_p=0.9), 1, False),
    # Options that count the target's ids: the draft drafts without them, verification applies them.
    (dict(temperature=1.0, repetition_penalty=1.5, logit_bias=((TARGET_TOKENS.index("b"), 1.0),)), 2, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("options,k,lookup", CASES)
def test_sampling_keeps_the_targets_distribution(pair, options, k, lookup):
    target, draft = pair
    params = SamplingParams(**options, max_new_tokens=LENGTH, ignore_eos=True)
    decoder = SpeculativeDecoder(target, draft, num_speculative_tokens=k, policy=FixedK(k), prompt_lookup=lookup)
    assert sampling_p_value(decoder, params) > 1e-3


class UnnormalisedDrafter(CrossTokenizerDrafter):
    """A biased mapping: drafts a shared token as the real drafter does, but reports q as the
    draft's whole-vocabulary probabilities cut to the shared tokens, without renormalising."""

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self._runner.restrict_vocabulary(None)

    def propose(self, sequence, k, params, generator, processor=None):
        logits = self._runner.forward_tail(self.context(sequence))[-1]  # [V_d] over every token
        q = logits_to_probs(logits, params)
        shared = self.vocabulary.to_target(q, 0.0)  # [V_t]: sums to less than 1
        token = sample(shared, generator)
        return Draft(tokens=token.reshape(1), probs=shared[None])


@pytest.mark.slow
def test_a_q_that_is_not_renormalised_over_the_shared_tokens_fails(pair):
    target, draft = pair
    params = SamplingParams(temperature=1.0, max_new_tokens=LENGTH, ignore_eos=True)
    decoder = SpeculativeDecoder(target, UnnormalisedDrafter(draft, target), num_speculative_tokens=1,
                                 policy=FixedK(1))
    assert sampling_p_value(decoder, params) < 1e-6

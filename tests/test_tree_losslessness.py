"""Trees keep the target's distribution: the acceptance rule on its own, then whole decoders.

The rule alone: a two-level tree over a vocabulary of 6 where the target's distribution after
each token is fixed; one verification, continued by one plain draw from the target where it
emitted a single token, must produce the first two tokens with probability
``p_root(a) * p_after[a](b)`` (36 cells). End to end: the test of ``test_losslessness`` (its
helpers are imported): 3 new tokens, every continuation's exact probability by enumeration.

Each part has a control: the same test on a rule that forgets to update ``p`` after a rejected
sibling must fail, or a pass proves nothing.
"""

from __future__ import annotations

import pytest
import torch

import quickdraft.verify_tree as verify_tree
from conftest import chi_square_p_value
from helpers import LENGTH, PROMPT, sample_counts
from conftest import exact_continuation_probs
from quickdraft import FixedK, SamplingParams, SpeculativeDecoder
from quickdraft.sampling import logits_to_probs
from quickdraft.tree import TreeSpec, static_parents
from quickdraft.verify_tree import verify_tree_sampled

V = 6
RUNS = 5000
CONTROL_RUNS = 2000  # the planted bug moves p-values to 1e-40 and below


def _forgetful_residual(p, q, token):
    """The bug the controls plant: a rejected sibling leaves ``p`` as it was."""
    return p


class TwoLevelModel:
    """p and q of a toy 'model': after the root, and after each first token (fixed depth 2)."""

    def __init__(self, params: SamplingParams, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.p_root = logits_to_probs(torch.randn(V, generator=g) * 1.5, params)  # [V]
        self.p_after = logits_to_probs(torch.randn(V, V, generator=g) * 1.5, params)  # [V, V]
        self.q_root = logits_to_probs(torch.randn(V, generator=g) * 1.5, params)
        self.q_after = logits_to_probs(torch.randn(V, V, generator=g) * 1.5, params)
        # below depth 2 nothing is checked: the bonus after a leaf is any distribution
        self.p_leaf = torch.full((V,), 1.0 / V)

    def exact_first_two(self) -> torch.Tensor:
        return (self.p_root[:, None] * self.p_after).reshape(-1)  # [V * V]

    def tree(self, widths, children, gen):
        """Tokens, parents, q rows, p rows of one drafted tree of depth 2.

        ``children``: "iid" draws each node's children from its q (tokens may repeat), "top"
        takes its most probable tokens (one-hot q), a list of root tokens fixes them (one-hot).
        """
        parents = static_parents(widths)
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        p_rows = [self.p_root]
        for node, parent in enumerate(parents):
            q = self.q_root if parent < 0 else self.q_after[tokens[parent]]
            siblings = [i for i in range(node) if parents[i] == parent]
            if children == "iid":
                token = int(torch.multinomial(q, 1, generator=gen))
            elif children == "top":
                token = int(torch.argsort(q, descending=True, stable=True)[len(siblings)])
            else:
                token = children[len(siblings)] if parent < 0 else int(torch.argmax(q))
            tokens.append(token)
            q_rows.append(q)
            p_rows.append(self.p_after[token] if parent < 0 else self.p_leaf)
        q_all = torch.stack(q_rows) if children == "iid" else None
        return torch.tensor(tokens), torch.tensor(parents), q_all, torch.stack(p_rows)


def first_two_counts(model: TwoLevelModel, widths, children, runs: int = RUNS) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V * V)
    for _ in range(runs):
        tokens, parents, q, p = model.tree(widths, children, gen)
        result = verify_tree_sampled(tokens, parents, q, p, gen)
        emitted = tokens[list(result.path)].tolist() + [result.next_token]
        if len(emitted) == 1:  # the target's next step, as decoding would continue
            emitted.append(int(torch.multinomial(model.p_after[emitted[0]], 1, generator=gen)))
        counts[emitted[0] * V + emitted[1]] += 1
    return counts


RULE_CASES = [
    # temperature, top_p, widths, children
    (1.0, 1.0, (3, 2), "iid"),  # with 6 tokens, drawn siblings repeat often
    (0.6, 0.85, (2, 2), "iid"),
    (1.0, 1.0, (3, 1), "top"),
    (1.4, 0.9, (3, 2), [2, 2, 4]),  # one-hot siblings repeating a token
]


@pytest.mark.parametrize("temperature,top_p,widths,children", RULE_CASES)
def test_the_tree_rule_keeps_the_target(temperature, top_p, widths, children):
    model = TwoLevelModel(SamplingParams(temperature=temperature, top_p=top_p))
    counts = first_two_counts(model, widths, children)
    assert chi_square_p_value(counts, model.exact_first_two()) > 1e-3


@pytest.mark.parametrize("children", ["iid", [2, 2, 4]])
def test_the_rule_test_catches_a_forgotten_residual(monkeypatch, children):
    monkeypatch.setattr(verify_tree, "residual", _forgetful_residual)
    model = TwoLevelModel(SamplingParams(temperature=1.0))
    counts = first_two_counts(model, (3, 2), children, runs=CONTROL_RUNS)
    assert chi_square_p_value(counts, model.exact_first_two()) < 1e-6


# ---- end to end ------------------------------------------------------------------------------

DECODER_CASES = [
    # temperature, top_k, top_p, tree (3 new tokens: at most 2 levels are drafted)
    (1.0, 0, 1.0, TreeSpec(widths=(3, 2), sample_children=True)),  # 8 tokens: repeats
    (0.6, 0, 0.85, TreeSpec(widths=(2, 2))),
    (1.4, 3, 0.9, TreeSpec(budget=6, depth=2, branch=3)),
]


def _params(temperature, top_k, top_p):
    return lambda seed: SamplingParams(  # noqa: E731
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=LENGTH, seed=seed
    )


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,spec", DECODER_CASES, ids=str)
def test_tree_sampling_matches_the_target(tiny_target, tiny_draft, temperature, top_k, top_p, spec):
    params = _params(temperature, top_k, top_p)
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, tree=spec, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3
    wrong = exact_continuation_probs(tiny_draft, PROMPT, LENGTH, params(0))
    assert chi_square_p_value(counts, wrong) < 1e-6


def test_the_decoder_test_catches_a_forgotten_residual(tiny_target, tiny_draft, monkeypatch):
    monkeypatch.setattr(verify_tree, "residual", _forgetful_residual)
    params = _params(1.0, 0, 1.0)
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    spec = TreeSpec(widths=(3, 2), sample_children=True)
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, tree=spec, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size, samples=500)  # the bias is large: p ~ 1e-90 at 600
    assert chi_square_p_value(counts, exact) < 1e-6


@pytest.mark.slow
def test_a_tree_drafted_over_part_of_the_vocabulary_keeps_the_target(tiny_target, tiny_draft):
    # As for chains (test_losslessness): the draft sees tokens 0..3 and the prompt's only.
    from quickdraft.drafters import DraftModelDrafter

    params = _params(0.9, 0, 1.0)
    exact = exact_continuation_probs(tiny_target, PROMPT, LENGTH, params(0))
    drafter = DraftModelDrafter(tiny_draft, vocabulary_size=4, tree=TreeSpec(widths=(2, 2), sample_children=True))
    decoder = SpeculativeDecoder(tiny_target, drafter, policy=FixedK(2))
    counts = sample_counts(decoder, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact) > 1e-3

"""The tree planner: cost curves, the tree it grows, its predictions against hand-computed ones."""

from __future__ import annotations

import math

import pytest
import torch

from quickdraft.bench.doctor import predicted_speedup
from quickdraft.bench.tree_plan import CostCurve, best_plans, grown_tree, plan_tree
from quickdraft.config import SamplingParams
from quickdraft.drafters.dynamic_tree import grow_dynamic_tree
from quickdraft.processing import LogitsProcessor


def test_a_cost_curve_interpolates_extrapolates_and_can_be_flat():
    curve = CostCurve(((8, 0.3), (1, 0.1), (4, 0.1)))  # any order
    assert curve(1) == curve(0) == curve(3) == 0.1
    assert curve(6) == pytest.approx(0.2)
    assert curve(12) == pytest.approx(0.5)  # the last segment continues
    assert CostCurve.flat(0.25)(100) == 0.25
    with pytest.raises(ValueError):
        CostCurve(())


def test_a_monotone_curve_pools_what_timing_noise_put_out_of_order():
    curve = CostCurve.monotone([(1, 0.2), (2, 0.18), (4, 0.22)])
    assert [s for _, s in curve.points] == pytest.approx([0.19, 0.19, 0.22])
    rising = CostCurve.monotone([(1, 0.1), (3, 0.3), (2, 0.2)])
    assert rising.points == ((1, 0.1), (2, 0.2), (3, 0.3))
    pooled = CostCurve.monotone([(1, 0.3), (2, 0.1), (3, 0.2)])
    assert [s for _, s in pooled.points] == pytest.approx([0.2, 0.2, 0.2])


def test_the_docstring_example():
    assert grown_tree((0.6, 0.2), budget=3, depth=2, branch=2) == pytest.approx([0.6, 0.36, 0.2])


def test_a_chain_plan_is_the_formula_of_leviathan_et_al():
    target, draft = 0.2, 0.03
    verify = CostCurve(((1, target), (2, 0.21), (3, 0.22), (4, 0.26)))
    level = CostCurve.flat(draft)
    for k in (1, 2, 3):
        plan = plan_tree((0.7, 0.2), k, k, 1, verify, level)
        assert plan.is_chain and plan.nodes == k
        assert plan.expected_tokens == pytest.approx((1 - 0.7 ** (k + 1)) / 0.3)
        assert plan.speedup == pytest.approx(predicted_speedup(0.7, k, draft / target, verify(k + 1) / target))


def test_a_tree_pays_for_each_depth_a_level_of_branch_nodes():
    verify = CostCurve(((1, 1.0), (10, 1.9)))
    level = CostCurve(((1, 0.1), (3, 0.2)))
    plan = plan_tree((0.5, 0.3, 0.1), budget=5, depth=3, branch=3, verify=verify, level=level)
    # Depth 1: 0.5, 0.3, 0.1; depth 2 expands all three: 0.25, 0.15, 0.15, 0.09, ...; depth 3 ...
    assert plan.nodes == 5
    assert plan.expected_tokens == pytest.approx(1 + 0.5 + 0.3 + 0.25 + 0.15 + 0.15)
    assert plan.seconds == pytest.approx(verify(6) + 0.1 + 2 * 0.2)
    assert plan.speedup == pytest.approx(plan.expected_tokens * 1.0 / plan.seconds)


def _builder_tree(hits, vocab, budget, depth, branch):
    """Run the engine's tree builder on a draft whose distribution is ``hits`` (then an even
    remainder) at every node; returns each node's path value under ``hits``."""
    rest = (1 - sum(hits)) / (vocab - len(hits))
    assert rest < min(hits), "the remainder must rank below every hit"
    q = torch.tensor(list(hits) + [rest] * (vocab - len(hits)))  # rank r is token r - 1
    logits = q.log()

    def expand(fed_tokens, fed_parents, n):
        return logits.expand(n, vocab)

    no_options = LogitsProcessor(SamplingParams(), vocab, prompt_ids=[])
    tokens, parents = grow_dynamic_tree(logits[None], depth, branch, budget, SamplingParams(), expand, no_options)
    values = []
    for i in range(len(tokens)):
        value, node = 1.0, i
        while node >= 0:
            value *= hits[tokens[node]] if tokens[node] < len(hits) else 0.0
            node = parents[node]
        values.append(value)
    return sorted(values, reverse=True)


@pytest.mark.parametrize("hits", [(0.55, 0.23, 0.09, 0.04), (0.47, 0.38, 0.1)])
@pytest.mark.parametrize("budget, depth, branch", [(1, 1, 1), (4, 4, 1), (6, 3, 2), (10, 3, 2), (10, 4, 3), (16, 5, 4)])
def test_the_planner_grows_the_tree_the_engine_grows(hits, budget, depth, branch):
    # The builder ranks by the draft's path probability, the planner by the product of hits:
    # with the draft's probabilities equal to the hits the two pick the same nodes.
    values = _builder_tree(hits, 12, budget, depth, branch)
    assert grown_tree(hits, budget, depth, branch) == pytest.approx(values)


def test_width_wins_where_it_is_free_and_loses_where_it_is_dear():
    hits = (0.5, 0.3, 0.1)
    flat = CostCurve.flat(1.0)
    chain, tree = best_plans(hits, flat, CostCurve.flat(0.05), max_nodes=31, max_depth=6, max_branch=4)
    assert chain.is_chain and not tree.is_chain and tree.speedup > 1.2 * chain.speedup
    # Every position past the first costs half a step, every node of a level another draft step.
    dear = CostCurve(((1, 1.0), (2, 1.5)))
    chain, tree = best_plans(hits, dear, CostCurve(((1, 0.05), (2, 0.1))), 31, 6, 4)
    assert tree.speedup < chain.speedup


def test_a_sampled_chain_is_planned_with_its_own_acceptance():
    flat, cheap = CostCurve.flat(1.0), CostCurve.flat(0.05)
    top_token, _ = best_plans((0.5, 0.3), flat, cheap, 8, 4, 2)
    sampled, _ = best_plans((0.5, 0.3), flat, cheap, 8, 4, 2, chain_acceptance=0.8)
    assert sampled.expected_tokens == pytest.approx((1 - 0.8 ** (sampled.depth + 1)) / 0.2)
    assert sampled.speedup > top_token.speedup


def test_a_perfect_draft_wants_the_longest_chain():
    chain, tree = best_plans((1.0, 0.0), CostCurve.flat(1.0), CostCurve.flat(0.01), 31, 8, 4)
    assert (chain.depth, chain.expected_tokens) == (8, 9.0)
    assert tree.speedup <= chain.speedup + 1e-12  # siblings of a sure token are never taken
    assert math.isclose(chain.speedup, 9.0 / 1.08)

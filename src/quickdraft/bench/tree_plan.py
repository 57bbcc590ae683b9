"""Which draft tree pays on this machine: expected tokens and step time of each tree shape.

A dynamic tree ``TreeSpec(budget=N, depth=D, branch=B)`` (docs/trees.md) is predicted from two
kinds of measurement:

* **rank hits** ``h_r``: the probability that the target takes the draft's r-th most probable
  token, ``E[p(x_r)]`` with ``p`` the target's distribution after the sampling parameters
  (greedy: 1 where ``x_r`` is the target's argmax). A tree's children are the draft's top
  tokens (a one-hot ``q``), and under recursive rejection child ``x_r`` is accepted with total
  probability ``p(x_r)``, so with acceptance independent from one depth to the next the path
  ``r_1, r_2, ..., r_d`` is accepted with probability ``h_{r_1} h_{r_2} ... h_{r_d}``, and a
  step emits ``1 + sum over nodes of that product`` tokens (the 1 is the target's own token).
* **costs**: seconds of a target forward over n positions (``CostCurve``; a tree of N nodes
  verifies N + 1), and of a draft forward over m nodes of one level.

The tree is grown as ``dynamic_tree.grow_dynamic_tree`` grows it, with the hit products in
place of the draft's path probabilities: at each depth the ``B`` best nodes are expanded with
their ``B`` best children (one draft forward of ``B`` nodes per depth after the first, which
is the root's one-token forward), and the tree is the ``N`` best nodes of all proposed. With
``B = 1`` and ``N = D = K`` this is a chain of K drafts and the formula of Leviathan et al.:
``(1 - a^(K+1)) / ((1 - a)(K c + v_K))`` with ``a = h_1``.

This is a static estimate: the engine's trees follow the draft's own confidence step by step,
and acceptance is burstier than independent. It answers "on this hardware, can width pay for
itself at all?", which is a question of costs.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CostCurve:
    """Seconds of a forward over n positions, measured at a few n and linear in between.

    ``points`` are ``(n, seconds)`` with distinct n; below the first n the first value holds,
    past the last the line through the last two points continues; a single point is flat.
    """

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(sorted((int(n), float(s)) for n, s in self.points)))
        if not self.points:
            raise ValueError("a cost curve needs at least one measured point")

    def __call__(self, n: float) -> float:
        if len(self.points) == 1 or n <= self.points[0][0]:
            return self.points[0][1]
        ns = [p[0] for p in self.points]
        i = min(bisect.bisect_left(ns, n), len(ns) - 1)  # the segment n lies on, or the last
        (n0, s0), (n1, s1) = self.points[i - 1], self.points[i]
        return s0 + (s1 - s0) * (n - n0) / (n1 - n0)

    @classmethod
    def monotone(cls, points: Sequence[tuple[int, float]]) -> CostCurve:
        """The non-decreasing curve closest to ``points`` in least squares (pool adjacent violators).

        A forward over more positions does not cost less; timings say otherwise only by noise
        (on a CPU a 4-position forward can time below a 1-position one), which should not pick
        a tree's shape. Example: ``(1, 0.2), (2, 0.18), (4, 0.22)`` -> ``0.19, 0.19, 0.22``.
        """
        blocks: list[list[float]] = []  # [sum of seconds, count], non-decreasing means
        for _, seconds in sorted(points):
            blocks.append([seconds, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
        means = [total / count for total, count in blocks for _ in range(count)]
        return cls(tuple((n, mean) for (n, _), mean in zip(sorted(points), means)))

    @classmethod
    def flat(cls, seconds: float) -> CostCurve:
        """Any number of positions for the price of one: hardware where width is free."""
        return cls(((1, seconds),))


@dataclass(frozen=True)
class TreePlan:
    """One tree shape and what it is predicted to do.

    Attributes:
        budget, depth, branch: the ``TreeSpec(budget=..., depth=..., branch=...)``; ``branch``
            1 is a chain of ``depth`` drafts.
        nodes: nodes the tree ends up with (at most ``budget``).
        expected_tokens: tokens a step emits, the target's own included.
        seconds: a step's predicted time: the draft's forwards and the verification.
        speedup: tokens per second over plain decoding's (one one-position target forward a token).
    """

    budget: int
    depth: int
    branch: int
    nodes: int
    expected_tokens: float
    seconds: float
    speedup: float

    @property
    def is_chain(self) -> bool:
        return self.branch == 1


def grown_tree(hits: Sequence[float], budget: int, depth: int, branch: int) -> list[float]:
    """Acceptance probability of each node of the tree ``grow_dynamic_tree`` would grow.

    Args:
        hits: ``[R]`` ``h_r``, rank 1 first; children beyond rank R are never proposed.

    Returns:
        Each kept node's probability that its whole path is accepted, best first.

    Example: hits ``(0.6, 0.2)``, budget 3, depth 2, branch 2: depth 1 proposes 0.6 and 0.2,
    depth 2 expands both (0.36, 0.12, 0.12, 0.04); the 3 best are ``[0.6, 0.36, 0.2]``.
    """
    pool: list[tuple[float, int]] = []  # (path probability, depth)
    frontier = [1.0]
    width = min(branch, len(hits))
    for d in range(1, depth + 1):
        children = [value * hits[r] for value in frontier for r in range(width)]
        pool.extend((child, d) for child in children)
        frontier = sorted(children, reverse=True)[:branch]
    pool.sort(key=lambda node: (-node[0], node[1]))  # ties to the shallower, as the builder does
    return [value for value, _ in pool[:budget]]


def plan_tree(hits: Sequence[float], budget: int, depth: int, branch: int,
              verify: CostCurve, level: CostCurve) -> TreePlan:
    """Predict ``TreeSpec(budget, depth, branch)`` from rank hits and forward costs.

    ``verify(n)``: a target forward over n positions; ``level(m)``: a draft forward over m
    nodes. The draft pays the root's one-token forward and one forward of ``branch`` nodes
    per further depth, whatever the final tree keeps (``grow_dynamic_tree`` expands every
    depth); plain decoding pays ``verify(1)`` a token.
    """
    nodes = grown_tree(hits, budget, depth, branch)
    expected = 1.0 + sum(nodes)
    seconds = verify(len(nodes) + 1) + level(1) + (depth - 1) * level(branch)
    return TreePlan(budget, depth, branch, len(nodes), expected, seconds, expected * verify(1) / seconds)


def best_plans(hits: Sequence[float], verify: CostCurve, level: CostCurve, max_nodes: int,
               max_depth: int, max_branch: int,
               chain_acceptance: float | None = None) -> tuple[TreePlan, TreePlan | None]:
    """The best chain (branch 1, K = 1..``max_depth``) and the best tree with branch >= 2.

    Trees range over budgets up to ``max_nodes``, depths up to ``max_depth`` and branches
    2..``max_branch``; ``None`` for the tree when ``max_branch`` < 2. Ties go to the smaller tree.
    ``chain_acceptance``: a chain's per-token acceptance when it is not ``h_1`` (a sampled
    chain accepts ``sum min(p, q)``, more than the draft's top token alone gets).
    """
    chain_hits = hits if chain_acceptance is None else (chain_acceptance,)
    chain = max((plan_tree(chain_hits, k, k, 1, verify, level) for k in range(1, max_depth + 1)),
                key=lambda p: p.speedup)
    trees = [plan_tree(hits, n, d, b, verify, level)
             for b in range(2, max_branch + 1) for d in range(1, max_depth + 1) for n in range(2, max_nodes + 1)]
    tree = max(trees, key=lambda p: (p.speedup, -p.budget)) if trees else None
    return chain, tree

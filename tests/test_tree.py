"""Draft trees: structure, mask and positions, the runner's tree forward and KV compaction, the
acceptance rules by hand, and greedy decoding with trees equal to plain greedy."""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_model
from helpers import PROMPTS, plain_greedy
from quickdraft import (
    FixedK,
    InvalidParameterError,
    SamplingParams,
    SpeculativeDecoder,
    UnsupportedModelError,
)
from quickdraft.cli import main
from quickdraft.drafters import Draft, DrafterBase, PromptLookupDrafter
from quickdraft.runner import ModelRunner
from quickdraft.tree import TreeSpec, children_of, follow, forward_layout, node_depths, static_parents
from quickdraft.verify import verify_greedy
from quickdraft.verify_tree import verify_tree_greedy, verify_tree_sampled

V = 5


def one_hot(token: int, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()


def rows_with_argmax(tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V] logits (or one-hot probabilities) whose row i peaks at tokens[i]."""
    return torch.stack([one_hot(t) for t in tokens])


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits after ``ids`` from a forward with no cache at all: the reference."""
    with torch.inference_mode():
        return model.module(input_ids=torch.tensor([ids])).logits[0, -1]


# ---- structure ----------------------------------------------------------------------------


def test_structure_helpers():
    assert static_parents([3, 2]) == [-1, -1, -1, 0, 0, 1, 1, 2, 2]
    assert TreeSpec(widths=(3, 2, 2, 1)).max_nodes == 33 == len(static_parents([3, 2, 2, 1]))
    assert node_depths([-1, -1, 0, 2]) == [1, 1, 2, 3]
    assert children_of([-1, -1, 0]) == {-1: [0, 1], 0: [2], 1: [], 2: []}
    # siblings 0 and 1 repeat token 7: the first is followed
    assert follow([7, 7, 3, 4], [-1, -1, 0, 1], [7, 3, 9]) == [0, 2]
    assert follow([7, 7, 3, 4], [-1, -1, 0, 1], [8]) == []


def test_the_docstring_example_of_mask_and_positions():
    mask, positions = forward_layout(cached=3, tail=1, parents=[-1, -1, 0])
    expected = torch.tensor([
        [1, 1, 1, 1, 0, 0, 0],  # d
        [1, 1, 1, 1, 1, 0, 0],  # x
        [1, 1, 1, 1, 0, 1, 0],  # y
        [1, 1, 1, 1, 1, 0, 1],  # z
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert positions.tolist() == [3, 4, 4, 5]
    # the same tree's last node fed alone, its ancestors already cached
    mask, positions = forward_layout(cached=4, tail=0, parents=[-1, -1, 0], first_node=2)
    assert mask.tolist() == [[True] * 4 + [True, False, True]] and positions.tolist() == [5]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({}, "exactly one"),
        ({"widths": (2,), "budget": 4}, "exactly one"),
        ({"widths": (2, 0)}, "widths"),
        ({"budget": 0}, "budget"),
        ({"budget": 8, "depth": 0}, "depth"),
        ({"widths": (2, 2), "depth": 3}, "len"),
        ({"budget": 8, "sample_children": True}, "static"),
        ({"budget": 8, "branch": 0}, "branch"),
    ],
)
def test_bad_tree_specs_are_refused(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        TreeSpec(**kwargs)


# ---- the runner: tree forward and compaction ------------------------------------------------

SEQUENCE = [1, 2, 3, 4]
# 4 ─┬─ 5 (0) ── 7 (2) ── 0 (4)
#    └─ 6 (1) ── 5 (3)            token 5 at two depths, under two parents
TOKENS = [5, 6, 7, 5, 0]
PARENTS = [-1, -1, 0, 1, 2]
PATHS = {0: [5], 1: [6], 2: [5, 7], 3: [6, 5], 4: [5, 7, 0]}


@pytest.mark.parametrize("cached", [0, 3])
def test_tree_forward_equals_each_path_on_its_own(tiny_target, cached):
    runner = ModelRunner(tiny_target)
    if cached:
        runner.forward(SEQUENCE[:cached])
    logits = runner.forward_tree(SEQUENCE, TOKENS, PARENTS, num_logits=len(TOKENS) + 1)  # [N + 1, V]
    assert torch.allclose(logits[0], fresh_logits(tiny_target, SEQUENCE), atol=1e-5)
    for node, path in PATHS.items():
        assert torch.allclose(logits[node + 1], fresh_logits(tiny_target, SEQUENCE + path), atol=1e-5), node
    assert runner.forwards == 1 + (cached > 0)


def test_a_tree_fed_level_by_level_equals_one_forward(tiny_target):
    runner = ModelRunner(tiny_target)
    runner.forward_tail(SEQUENCE)
    first = runner.forward_tree(SEQUENCE, TOKENS[:2], PARENTS[:2], num_logits=2)
    second = runner.forward_tree(SEQUENCE, TOKENS[:4], PARENTS[:4], num_logits=2)
    third = runner.forward_tree(SEQUENCE, TOKENS, PARENTS, num_logits=1)
    assert runner.positions == len(SEQUENCE) + len(TOKENS)  # no node fed twice
    for rows, nodes in [(first, [0, 1]), (second, [2, 3]), (third, [4])]:
        for row, node in zip(rows, nodes):
            assert torch.allclose(row, fresh_logits(tiny_target, SEQUENCE + PATHS[node]), atol=1e-5)


@pytest.mark.parametrize("path", [[1, 3], [0, 2, 4], [0, 2], [1], []])
def test_keeping_a_path_leaves_the_cache_of_its_text(tiny_target, path):
    runner = ModelRunner(tiny_target)
    runner.forward(SEQUENCE[:-1])
    runner.forward_tree(SEQUENCE, TOKENS, PARENTS, num_logits=len(TOKENS) + 1)
    runner.keep_tree_path(path)
    text = SEQUENCE + [TOKENS[node] for node in path]
    assert runner.cached_ids == text
    cached = runner.forward([2, 6], num_logits=2)  # the next tokens, on the compacted cache
    with torch.inference_mode():
        fresh = tiny_target.module(input_ids=torch.tensor([text + [2, 6]])).logits[0, -2:]
    assert torch.allclose(cached, fresh, atol=1e-5)


def test_a_drafter_keeps_the_nodes_the_next_sequence_goes_through(tiny_target):
    runner = ModelRunner(tiny_target)
    runner.forward_tail(SEQUENCE)
    runner.forward_tree(SEQUENCE, TOKENS[:4], PARENTS[:4], num_logits=4)
    accepted = SEQUENCE + [5, 7, 0, 3]  # nodes 0, 2, then 0 (node 4, never fed) and a new token
    runner.keep_tree_along(accepted)
    assert runner.cached_ids == SEQUENCE + [5, 7]
    logits = runner.forward_tail(accepted)
    assert runner.positions == len(SEQUENCE) + 4 + 2  # only 0 and 3 fed again
    assert torch.allclose(logits[-1], fresh_logits(tiny_target, accepted), atol=1e-5)


def test_an_uncommitted_tree_is_rolled_back_like_rejected_drafts(tiny_target):
    runner = ModelRunner(tiny_target)
    runner.forward_tree(SEQUENCE, TOKENS, PARENTS, num_logits=len(TOKENS) + 1)
    logits = runner.forward_tail(SEQUENCE + [5, 2])  # 5 is node 0's token, but not committed
    assert runner.cached_ids == SEQUENCE + [5, 2]
    assert torch.allclose(logits[-1], fresh_logits(tiny_target, SEQUENCE + [5, 2]), atol=1e-5)


def test_trees_are_refused_for_sliding_window_caches():
    from transformers import MistralConfig, MistralForCausalLM

    from quickdraft.models.base import LoadedModel

    config = MistralConfig(
        vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4, max_position_embeddings=64,
    )
    runner = ModelRunner(LoadedModel(MistralForCausalLM(config).eval(), None, "window"))
    with pytest.raises(UnsupportedModelError, match="full-attention"):
        runner.forward_tree(SEQUENCE, TOKENS, PARENTS, num_logits=2)


# ---- acceptance, by hand ------------------------------------------------------------------------

# root ─┬─ 1 (0) ─┬─ 2 (2)
#       │         └─ 3 (3)
#       └─ 4 (1) ──── 0 (4)
HAND_TOKENS = torch.tensor([1, 4, 2, 3, 0])
HAND_PARENTS = torch.tensor([-1, -1, 0, 0, 1])


def test_greedy_perfect_path_takes_the_bonus_token():
    # row i + 1 is after node i: argmax 1 after the root, 3 after node 0, 2 after node 3
    logits = rows_with_argmax([1, 3, 0, 0, 2, 0])
    result = verify_tree_greedy(HAND_TOKENS, HAND_PARENTS, logits)
    assert (result.path, result.next_token) == ((0, 3), 2)


def test_greedy_rejection_at_the_root():
    result = verify_tree_greedy(HAND_TOKENS, HAND_PARENTS, rows_with_argmax([3, 0, 0, 0, 0, 0]))
    assert (result.path, result.next_token) == ((), 3)


def test_greedy_second_sibling_accepted_then_mismatch():
    result = verify_tree_greedy(HAND_TOKENS, HAND_PARENTS, rows_with_argmax([4, 0, 3, 0, 0, 0]))
    assert (result.path, result.next_token) == ((1,), 3)  # node 1's child is 0, not 3


def test_greedy_on_a_chain_tree_agrees_with_the_chain_rule():
    chain = torch.tensor([1, 2, 3])
    for argmaxes in ([1, 2, 3, 4], [1, 0, 3, 4], [4, 2, 3, 4]):
        logits = rows_with_argmax(argmaxes)
        tree = verify_tree_greedy(chain, torch.tensor([-1, 0, 1]), logits)
        flat = verify_greedy(chain, logits)
        assert (tree.num_accepted, tree.next_token) == (flat.num_accepted, flat.next_token)


def _runs(tokens, parents, q, p, seeds):
    """(path, next token) of one verification per seed."""
    results = [verify_tree_sampled(tokens, parents, q, p, torch.Generator().manual_seed(s)) for s in range(seeds)]
    return [(r.path, r.next_token) for r in results]


def _outcomes(tokens, parents, q, p, seeds=300):
    return set(_runs(tokens, parents, q, p, seeds))


def test_sampled_perfect_path_and_bonus():
    p = rows_with_argmax([1, 3, 0, 0, 2, 0])  # certain: 1, then 3, then (after node 3) 2
    assert _outcomes(HAND_TOKENS, HAND_PARENTS, None, p, seeds=30) == {((0, 3), 2)}


def test_sampled_rejection_at_the_root_draws_from_the_residual():
    # p puts nothing on the children's tokens 1 and 4: both rejected, never emitted
    p = torch.zeros(6, V)
    p[0] = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0])
    assert _outcomes(HAND_TOKENS, HAND_PARENTS, None, p) == {((), 2), ((), 3)}


def test_sampled_second_sibling_accepted():
    p = rows_with_argmax([4, 0, 0, 0, 0, 3])
    assert _outcomes(HAND_TOKENS, HAND_PARENTS, None, p, seeds=30) == {((1, 4), 3)}  # then bonus 3


def test_one_hot_siblings_use_the_residual():
    # p = 0.5 on 1, 0.3 on 4, 0.2 on 2: 1 accepted half the time; after its rejection 4 is
    # accepted with 0.3 / 0.5; after both, 2 is the only token left. 1 and 4 are never recovered.
    tokens, parents = torch.tensor([1, 4]), torch.tensor([-1, -1])
    p = torch.tensor([[0.0, 0.5, 0.2, 0.0, 0.3], one_hot(0).tolist(), one_hot(3).tolist()])
    outcomes = _runs(tokens, parents, None, p, seeds=2000)
    assert set(outcomes) == {((0,), 0), ((1,), 3), ((), 2)}
    shares = [outcomes.count(o) / len(outcomes) for o in [((0,), 0), ((1,), 3), ((), 2)]]
    assert shares == pytest.approx([0.5, 0.3, 0.2], abs=0.04)


def test_repeated_siblings_are_rejected_after_their_first_copy():
    # Both children drew token 1 from q; p(1) < q(1), so the first copy is accepted with
    # p/q = 0.5, and when it is rejected the residual has no mass on 1: the second copy is
    # never accepted, and the recovered token comes from max(0, p - q) = token 2.
    tokens, parents = torch.tensor([1, 1]), torch.tensor([-1, -1])
    q = torch.tensor([[0.0, 0.8, 0.2, 0.0, 0.0]] * 2)
    p = torch.tensor([[0.0, 0.4, 0.6, 0.0, 0.0], one_hot(3).tolist(), one_hot(4).tolist()])
    assert _outcomes(tokens, parents, q, p) == {((0,), 3), ((), 2)}
    # one-hot copies of the same token: the same, with the residual p(1) := 0
    assert _outcomes(tokens, parents, None, p) == {((0,), 3), ((), 2)}


def test_an_empty_tree_samples_from_p():
    p = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    nothing = torch.empty(0, dtype=torch.long)
    result = verify_tree_sampled(nothing, nothing, None, p, None)
    assert (result.path, result.next_token) == ((), 3)


# ---- drafters ---------------------------------------------------------------------------------


def test_prompt_lookup_tree_merges_matches_into_a_trie():
    drafter = PromptLookupDrafter(max_ngram=1, tree=TreeSpec(widths=(3, 1)))
    # "a b a c a" (0 1 0 2 0) ends in a, found at 2 and 0: branches "c a" and "b a"
    draft = drafter.propose([0, 1, 0, 2, 0], k=5, params=SamplingParams(), generator=None)
    assert draft.tokens.tolist() == [2, 0, 1, 0] and draft.parents.tolist() == [-1, 0, -1, 2]
    # shared beginnings share nodes: "5 6 8" and "5 6 7" follow the two earlier 9s
    drafter = PromptLookupDrafter(max_ngram=1, tree=TreeSpec(widths=(3, 1, 1)))
    draft = drafter.propose([9, 5, 6, 7, 9, 5, 6, 8, 9], k=5, params=SamplingParams(), generator=None)
    assert draft.tokens.tolist() == [5, 6, 8, 7] and draft.parents.tolist() == [-1, 0, 1, 1]
    # k caps the depth
    draft = drafter.propose([9, 5, 6, 7, 9, 5, 6, 8, 9], k=1, params=SamplingParams(), generator=None)
    assert draft.tokens.tolist() == [5] and draft.depth == 1


def test_tree_option_errors(tiny_target):
    with pytest.raises(InvalidParameterError, match="tree"):
        SpeculativeDecoder(tiny_target, None, tree=TreeSpec(widths=(2,)))

    class Custom(DrafterBase):
        def propose(self, sequence, k, params, generator, processor):
            return Draft(tokens=torch.tensor([1]))

    with pytest.raises(InvalidParameterError, match="own trees"):
        SpeculativeDecoder(tiny_target, Custom(), tree=TreeSpec(widths=(2,)))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tree", "3,x"], "comma-separated"),
        (["--tree", "2,0"], "widths"),
        (["--tree", "2", "--tree-budget", "4"], "not both"),
        (["--tree", "2", "--draft", "none"], "needs a draft"),
        (["--tree-branch", "2"], "give --tree-budget"),
        (["--tree-budget", "8", "--tree-branch", "0"], "branch"),
    ],
)
def test_cli_tree_options_fail_before_loading(capsys, args, message):
    assert main(["generate", "--prompt", "hi", "--target", "/no/such/model", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_tree_options_give_the_tree_spec():
    from quickdraft.cli import build_parser
    from quickdraft.cli_common import tree_from_args

    def spec(*args):
        return tree_from_args(build_parser().parse_args(["generate", "--prompt", "hi", *args]))

    assert spec() is None
    assert spec("--tree", "3,1") == TreeSpec(widths=(3, 1))
    assert spec("--tree-budget", "5", "-k", "2", "--tree-branch", "2") == TreeSpec(budget=5, depth=2, branch=2)
    assert spec("--tree-budget", "16").branch == TreeSpec(budget=16).branch


# ---- greedy decoding with trees equals plain greedy ------------------------------------------------

SHAPES = [
    TreeSpec(widths=(3, 2, 2, 1)),
    TreeSpec(widths=(2, 2)),
    TreeSpec(widths=(1, 1, 1, 1)),  # a chain, through the tree path
    TreeSpec(widths=(3, 2), sample_children=True),  # greedy takes the top tokens anyway
    TreeSpec(budget=8, depth=4, branch=3),
    TreeSpec(budget=20, depth=5),
]


@pytest.mark.parametrize("seeds", [(1, 2), (3, 4)])
@pytest.mark.parametrize("spec", SHAPES, ids=str)
def test_greedy_tree_decoding_equals_plain_greedy(seeds, spec):
    target, draft = make_tiny_model(seeds[0]), make_tiny_model(seeds[1])
    decoder = SpeculativeDecoder(target, draft, tree=spec, policy=FixedK(spec.max_depth))
    for prompt in PROMPTS:
        out = decoder.generate(prompt, SamplingParams(max_new_tokens=24))
        assert out.token_ids == plain_greedy(target, prompt, 24), prompt


@pytest.mark.parametrize(
    "spec", [TreeSpec(widths=(3, 2, 2)), TreeSpec(widths=(1, 1, 1)), TreeSpec(budget=6, depth=4)], ids=str
)
def test_greedy_prompt_lookup_trees_equal_plain_greedy(tiny_target, spec):
    decoder = SpeculativeDecoder(tiny_target, "ngram", tree=spec, policy=FixedK(spec.max_depth))
    accepted = 0
    for prompt in PROMPTS:
        out = decoder.generate(prompt, SamplingParams(max_new_tokens=30))
        assert out.token_ids == plain_greedy(tiny_target, prompt, 30), prompt
        accepted += out.stats.accepted_tokens
    assert accepted > 0  # random tiny models fall into loops, which n-grams predict


def test_the_adaptive_policy_with_a_tree_keeps_greedy_output(tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(tiny_target, tiny_draft, tree=TreeSpec(widths=(2, 2, 1)))
    for prompt in PROMPTS:
        out = decoder.generate(prompt, SamplingParams(max_new_tokens=40))
        assert out.token_ids == plain_greedy(tiny_target, prompt, 40)


def test_a_perfect_draft_accepts_every_depth_and_nothing_is_recomputed(tiny_target):
    spec = TreeSpec(widths=(2, 2))  # 6 nodes, depth 2: each step emits 3 tokens
    prompt = [1, 2, 3, 4]
    decoder = SpeculativeDecoder(tiny_target, tiny_target, tree=spec, policy=FixedK(2), prompt_lookup=False)
    s = decoder.generate(prompt, SamplingParams(max_new_tokens=30)).stats
    assert s.steps == 10 and s.mean_tokens_per_step == 3.0
    assert s.acceptance_by_position == [1.0, 1.0]  # by depth
    # the target: the prompt but its last token once, then per step the root and 6 nodes
    assert s.target_forwards == 1 + s.steps
    assert s.target_positions == (len(prompt) - 1) + s.steps * (1 + 6)
    # the draft: one forward for the root and one for the depth-1 level per step; a step
    # feeds the root's 1 token (the first, the prompt with it; later ones 2: the accepted leaf,
    # never fed, and the root)
    assert s.draft_forwards == 2 * s.steps
    assert s.draft_positions == (len(prompt) - 1) + 1 + 2 * (s.steps - 1) + 2 * s.steps

"""The batched engine on tiny random models: every row equals its own plain decoding, whatever
joins or leaves the batch around it; seeds, stops, cancellation and the cache."""

from __future__ import annotations

import re
from unittest.mock import patch

import pytest
import torch

from helpers import Curve
from quickdraft import ContextLengthError, FixedK, InvalidParameterError, SamplingParams, SpeculativeDecoder
from quickdraft.batch import BatchEngine
from quickdraft.batch.policy import GoodputPolicy
from quickdraft.batch.cache import BatchKVCache
from quickdraft.batch.limits import KByBatchSize
from quickdraft.batch.runner import BatchRunner, forward_some
from quickdraft.drafters import DraftModelDrafter
from quickdraft.drafters.base import RowAsk
from quickdraft.drafters.registry import DEFAULT_DRAFT_CONTEXT_WINDOW
from quickdraft.drafters.vocabulary import BatchOutputRows, draft_vocabulary
from quickdraft.policy import LOOKUP, MODEL
from quickdraft.runner import OutputRows, common_prefix_length

PROMPTS = [[1, 2, 3], [5], [0, 7, 7, 1, 2, 6, 3, 3, 4], [4, 4, 2, 6] * 6, [6, 1]]


def plain_greedy(model, prompt, n):
    """Reference: the target alone (``SpeculativeDecoder(target, None)``), greedy."""
    return SpeculativeDecoder(model, None).generate(prompt, SamplingParams(max_new_tokens=n)).token_ids


def drafters(tiny_draft):
    return {"plain": None, "ngram": "ngram", "draft model": tiny_draft}


def run_until_done(engine: BatchEngine, outputs: dict[int, list[int]], finished: set[int], steps: int | None = None) -> None:
    """Step ``engine`` (``steps`` times, or until idle), collecting tokens by request id."""
    count = 0
    while engine.rows and (steps is None or count < steps):
        for event in engine.step():
            outputs.setdefault(event.request_id, []).extend(event.chunk.token_ids)
            if event.done:
                finished.add(event.request_id)
        count += 1


class RecordingK(FixedK):
    """``FixedK`` that records each step's decoding rows and joining rows."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.seen: list[tuple[int, int]] = []

    def decide(self, rows, joining=0, ragged=False):
        self.seen.append((len(rows), joining))
        return super().decide(rows, joining, ragged)


def test_the_policy_is_told_of_the_rows_still_reading_their_prompts(tiny_target, tiny_draft):
    # A one-token prompt decodes from the first step; two 24-token prompts read 23 tokens each,
    # 10 a step in all, one after the other: the first decodes from step 3, the second from 5.
    policy = RecordingK(2)
    engine = BatchEngine(tiny_target, tiny_draft, 2, policy=policy, prefill_chunk_tokens=10)
    for prompt in (PROMPTS[1], PROMPTS[3], [2, 6, 4, 4] * 6):  # no prefix in common
        engine.add(prompt, SamplingParams(max_new_tokens=8))
    run_until_done(engine, {}, set(), steps=6)
    assert policy.seen[:6] == [(1, 2), (1, 2), (2, 1), (2, 1), (3, 0), (3, 0)]


SHARED = [4, 4, 2, 6, 1] * 4  # 20 tokens, e.g. a chat template's system prompt


def test_a_joining_row_copies_the_prompt_prefix_another_row_holds(tiny_target):
    engine = BatchEngine(tiny_target, None)
    prompts = [SHARED + [1, 2], SHARED + [7], SHARED + [3, 5, 5]]
    outputs: dict[int, list[int]] = {}
    ids = {engine.add(prompts[0], SamplingParams(max_new_tokens=6)): 0}
    run_until_done(engine, outputs, set(), steps=1)
    before = engine._target.positions
    ids.update({engine.add(p, SamplingParams(max_new_tokens=6)): i for i, p in enumerate(prompts[1:], 1)})
    run_until_done(engine, outputs, set(), steps=1)
    # Row 1 holds all but its last token by copying; row 2 reads 2 of its 22; each row decodes one.
    assert engine._target.positions - before == 2 + 3
    run_until_done(engine, outputs, set())
    for request, index in ids.items():
        assert outputs[request] == plain_greedy(tiny_target, prompts[index], 6), index


def test_rows_joining_together_read_a_shared_prefix_once(tiny_target):
    # The second row waits a step for the first to read the 20 tokens both begin with.
    engine = BatchEngine(tiny_target, None)
    prompts = [SHARED + [1, 2], SHARED + [3, 5, 5]]
    ids = {engine.add(p, SamplingParams(max_new_tokens=5)): i for i, p in enumerate(prompts)}
    policy = RecordingK(0)
    engine.policy = policy
    outputs: dict[int, list[int]] = {}
    run_until_done(engine, outputs, set(), steps=1)
    assert engine._target.positions == 21 + 1 and policy.seen == [(1, 1)]
    run_until_done(engine, outputs, set(), steps=1)
    assert engine._target.positions == 22 + 2 + 2  # the second reads 2 tokens of 22
    run_until_done(engine, outputs, set())
    for request, index in ids.items():
        assert outputs[request] == plain_greedy(tiny_target, prompts[index], 5), index


def test_the_draft_model_copies_what_another_row_read_of_a_shared_prompt(tiny_target, tiny_draft, monkeypatch):
    # Three rows beginning alike draft from their first step: the draft model reads the 20
    # shared tokens once, and every row's output is still its plain greedy output.
    prompts = [SHARED + [1, 2], SHARED + [3, 5, 5], SHARED + [6]]

    def run() -> tuple[int, dict[int, list[int]]]:
        engine = BatchEngine(tiny_target, tiny_draft, 2, policy=FixedK(2), prompt_lookup=False)
        outputs: dict[int, list[int]] = {}
        ids = {engine.add(p, SamplingParams(max_new_tokens=8)): i for i, p in enumerate(prompts)}
        run_until_done(engine, outputs, set())
        return engine._drafter.runner.positions, {ids[request]: tokens for request, tokens in outputs.items()}

    shared_positions, shared_outputs = run()
    monkeypatch.setattr(BatchRunner, "share_prefix",
                        lambda self, row, sequence: common_prefix_length(self.cached_ids[row], sequence))
    alone_positions, alone_outputs = run()
    assert shared_outputs == alone_outputs == {i: plain_greedy(tiny_target, p, 8) for i, p in enumerate(prompts)}
    assert shared_positions <= alone_positions - 2 * 20


def test_a_rows_first_step_counts_in_an_acceptance_of_its_own(tiny_target, tiny_draft):
    engine = BatchEngine(tiny_target, tiny_draft, 2, policy=FixedK(2), prompt_lookup=False)
    engine.add(PROMPTS[0], SamplingParams(max_new_tokens=8))
    run_until_done(engine, {}, set(), steps=1)
    assert engine.last_drafted == [2] and engine._acceptance[MODEL].tried == 0
    assert engine._first_acceptance[MODEL].tried > 0
    engine._first_acceptance[MODEL].value = 0.125  # what the policy is told of a row's first step
    engine._acceptance[MODEL].value = 0.75
    engine.add(PROMPTS[1], SamplingParams(max_new_tokens=8))
    with patch.object(engine.policy, "decide", wraps=engine.policy.decide) as decide:
        run_until_done(engine, {}, set(), steps=1)
    assert [row.acceptance for row in decide.call_args.args[0]] == [0.75, 0.125]
    assert engine._acceptance[MODEL].tried > 0


def test_a_shared_prompt_no_draft_holds_is_charged_once_among_the_rows_sharing_it(tiny_target, tiny_draft):
    # Two rows with one prompt (P tokens, a token decoded): the second joined while the first
    # was there, so it may copy all but the prompt's last token from it (P - 1). While no draft
    # holds that prefix, one of the two reads it and the other copies: the second is charged
    # its half, the first (which shared nothing when it joined) its whole sequence. Once the
    # first row's draft holds it, the second is 1 behind: still to copy, never level.
    engine = BatchEngine(tiny_target, tiny_draft, 2, policy=FixedK(0), prompt_lookup=False)
    for _ in range(2):
        engine.add(PROMPTS[0], SamplingParams(max_new_tokens=8))
    run_until_done(engine, {}, set(), steps=1)
    prompt = len(PROMPTS[0])
    drafter = engine._drafter
    reading = {i: drafter.view(i, row.sequence) for i, row in enumerate(engine._rows)}
    assert drafter.runner.cached_ids[0] == [] and drafter.prompt_to_read(1) == 1  # shared: prompt - 1
    assert [drafter.behind(i, reading[i], reading) for i in range(2)] == [prompt, 1 + -(-(prompt - 1) // 2)]
    first = engine._rows[0]
    drafter.propose_rows([RowAsk(0, first.sequence, 1, SamplingParams(), None, first.processor)])  # reads it
    assert [drafter.behind(i, reading[i], reading) for i in range(2)] == [0, 1]
    assert drafter.behind(1, reading[1]) == prompt  # what it reads unless it copies


def test_a_row_whose_twin_left_is_charged_the_prompt_it_can_no_longer_copy(tiny_target, tiny_draft):
    # The second row joined with a twin that has left without drafting: nothing holds its
    # prompt, and it alone reads it.
    engine = BatchEngine(tiny_target, tiny_draft, 2, policy=FixedK(0), prompt_lookup=False)
    first = engine.add(PROMPTS[0], SamplingParams(max_new_tokens=8))
    engine.add(PROMPTS[0], SamplingParams(max_new_tokens=8))
    run_until_done(engine, {}, set(), steps=1)
    engine.cancel(first)
    drafter = engine._drafter
    assert len(engine._rows) == 1 and drafter.prompt_to_read(0) < len(PROMPTS[0])  # it shared when it joined
    view = drafter.view(0, engine._rows[0].sequence)
    assert drafter.behind(0, view, {0: view}) == drafter.behind(0, view) == len(PROMPTS[0])


def test_a_row_given_another_rows_prefix_computes_what_it_would_alone(tiny_target):
    shared = BatchRunner(tiny_target)
    alone = BatchRunner(tiny_target)
    for runner in (shared, alone):
        runner.add_row()
        runner.add_row()
    shared.forward(0, [SHARED + [1, 2]], [0])
    assert shared.share_prefix(1, SHARED + [3]) == 20
    assert shared.share_prefix(1, [9] + SHARED) == 0  # nothing in common: its own (empty) cache
    assert shared.share_prefix(1, SHARED + [3]) == 20
    assert shared.cached_ids[1] == SHARED and alone.cached_ids[1] == []
    got = shared.forward_tails(1, [SHARED + [3, 5]], [2])[0]
    want = alone.forward_tails(1, [SHARED + [3, 5]], [2])[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["plain", "ngram", "draft model"])
def test_greedy_rows_joining_and_leaving_equal_plain_greedy(tiny_target, tiny_draft, kind):
    engine = BatchEngine(tiny_target, drafters(tiny_draft)[kind], num_speculative_tokens=3, prefill_chunk_tokens=5)
    lengths = [24, 7, 18, 30, 12]
    outputs: dict[int, list[int]] = {}
    finished: set[int] = set()
    ids = {engine.add(PROMPTS[0], SamplingParams(max_new_tokens=lengths[0])): 0,
           engine.add(PROMPTS[1], SamplingParams(max_new_tokens=lengths[1])): 1}
    run_until_done(engine, outputs, finished, steps=3)
    # Row 2 joins mid-generation; row 3's prompt (24 tokens) takes several prefill chunks.
    ids[engine.add(PROMPTS[2], SamplingParams(max_new_tokens=lengths[2]))] = 2
    ids[engine.add(PROMPTS[3], SamplingParams(max_new_tokens=lengths[3]))] = 3
    run_until_done(engine, outputs, finished, steps=4)
    assert 1 in {ids[i] for i in finished}  # the short one left while the others run
    ids[engine.add(PROMPTS[4], SamplingParams(max_new_tokens=lengths[4]))] = 4
    run_until_done(engine, outputs, finished)
    assert len(finished) == 5 and engine.rows == 0
    for request, index in ids.items():
        assert outputs[request] == plain_greedy(tiny_target, PROMPTS[index], lengths[index]), index
    assert engine.cache_bytes == 0  # the last row to leave freed the buffers


def test_the_batch_drafts(tiny_target, tiny_draft):
    outputs = BatchEngine(tiny_target, tiny_draft, 3, policy=FixedK(3)).generate_batch(
        PROMPTS, SamplingParams(max_new_tokens=20))
    assert all(o.stats.drafted_tokens > 0 for o in outputs)
    assert sum(o.stats.accepted_tokens for o in outputs) > 0
    assert all(o.stats.steps < 20 for o in outputs if o.stats.accepted_tokens)


@pytest.mark.parametrize("kind", ["ngram", "draft model"])
def test_a_request_limits_what_its_row_drafts_and_its_output_stays_plain_greedy(tiny_target, tiny_draft, kind):
    limits = [0, 1, None, 0, 2]
    params = [SamplingParams(max_new_tokens=20, num_speculative_tokens=limit) for limit in limits]
    outputs = BatchEngine(tiny_target, drafters(tiny_draft)[kind], 3, policy=FixedK(3)).generate_batch(
        PROMPTS, params)
    for prompt, limit, output in zip(PROMPTS, limits, outputs):
        assert output.token_ids == plain_greedy(tiny_target, prompt, 20)
        assert len(output.stats.drafted_by_position) <= (3 if limit is None else limit)
        if limit == 0:
            assert output.stats.drafted_tokens == 0 and output.stats.steps == 20
    if kind == "draft model":  # the others drafted beside the rows that did not
        assert all(output.stats.drafted_tokens > 0 for limit, output in zip(limits, outputs) if limit != 0)



class SizeRecordingK(FixedK):
    """``FixedK`` that records each step's running requests and what each row drafts."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.seen: list[tuple[int, list[int]]] = []

    def decide(self, rows, joining=0, ragged=False):
        decision = super().decide(rows, joining, ragged)
        self.seen.append((len(rows) + joining, list(decision.drafts)))
        return decision


@pytest.mark.parametrize("kind", ["ngram", "draft model"])
def test_k_by_batch_size_caps_what_rows_draft_by_the_running_requests_and_outputs_stay_plain_greedy(
        tiny_target, tiny_draft, kind):
    limits = KByBatchSize.parse("1-2:1,3-4:0")  # 5 requests: K = 3 there
    policy = SizeRecordingK(3)
    lengths = [6, 10, 14, 18, 22]  # the batch shrinks as they finish
    engine = BatchEngine(tiny_target, drafters(tiny_draft)[kind], 3, policy=policy, k_by_batch_size=limits)
    outputs = engine.generate_batch(PROMPTS, [SamplingParams(max_new_tokens=n) for n in lengths])
    for prompt, n, output in zip(PROMPTS, lengths, outputs):
        assert output.token_ids == plain_greedy(tiny_target, prompt, n)
    for size, drafts in policy.seen:
        assert max(drafts, default=0) <= limits.limit(size, 3), (size, drafts)
    if kind == "draft model":  # the draft model drafts whatever the text: each ceiling was reached
        most = {size: max(max(drafts, default=0) for s, drafts in policy.seen if s == size) for size, _ in policy.seen}
        assert most == {5: 3, 4: 0, 3: 0, 2: 1, 1: 1}


def test_k_by_batch_size_zero_reads_nothing_with_the_draft_model_and_drafts_nothing(tiny_target, tiny_draft):
    engine = BatchEngine(tiny_target, tiny_draft, 3, policy=FixedK(3), k_by_batch_size=KByBatchSize.parse("1-:0"))
    outputs = engine.generate_batch(PROMPTS, SamplingParams(max_new_tokens=12))
    assert all(o.stats.drafted_tokens == 0 and o.stats.steps == 12 for o in outputs)
    assert all(o.token_ids == plain_greedy(tiny_target, p, 12) for p, o in zip(PROMPTS, outputs))
    assert engine._drafter.runner.positions == 0  # no prompt read, no draft forward


def test_a_seeded_row_keeps_its_k_under_a_ceiling_by_batch_size(tiny_target, tiny_draft):
    params = SamplingParams(temperature=0.9, max_new_tokens=16, seed=11)
    alone = BatchEngine(tiny_target, tiny_draft, 3).generate_batch([PROMPTS[2]], params)[0]
    capped = BatchEngine(tiny_target, tiny_draft, 3, k_by_batch_size=KByBatchSize.parse("1-:0")).generate_batch(
        [PROMPTS[2], PROMPTS[0]], [params, SamplingParams(max_new_tokens=16)])
    assert capped[0].token_ids == alone.token_ids and capped[0].stats.drafted_tokens == alone.stats.drafted_tokens > 0
    assert capped[1].stats.drafted_tokens == 0

def test_each_step_logs_what_the_policy_chose_and_what_it_cost_at_debug(tiny_target, tiny_draft, caplog):
    engine = BatchEngine(tiny_target, tiny_draft, 3, policy=FixedK(2), prompt_lookup=False)
    with caplog.at_level("DEBUG", logger="quickdraft.batch"):
        outputs = engine.generate_batch(PROMPTS[:2], SamplingParams(max_new_tokens=6))
    lines = [r.getMessage() for r in caplog.records if r.name == "quickdraft.batch"]
    assert len(lines) == max(o.stats.steps for o in outputs)  # one a step
    first = lines[0]
    # Both rows decode from the first step, draft 2 each, and the draft model reads their prompts.
    caught_up = sum(len(p) - 1 for p in PROMPTS[:2])
    assert first.startswith("step: 2 rows decoding, 0 joining; k 2; 2 rows drafted 4 tokens, "
                            f"the draft model read {caught_up} positions catching up;"), first
    emitted = sum(int(line.split("; ")[3].split()[0]) for line in lines)
    assert emitted == sum(len(o.token_ids) for o in outputs)
    assert "estimated" not in first and "verify 0." in first  # FixedK estimates nothing
    caplog.clear()
    with caplog.at_level("DEBUG", logger="quickdraft.batch"):
        BatchEngine(tiny_target, tiny_draft, 3).generate_batch(PROMPTS[:2], SamplingParams(max_new_tokens=6))
    assert any(re.search(r"; estimated \d+\.\d tok/s, plain \d+\.\d; gain", r.getMessage()) for r in caplog.records)


@pytest.mark.parametrize("kind", ["ngram", "draft model"])
def test_a_seeded_row_reproduces_its_output_whatever_its_batch_mates(tiny_target, tiny_draft, kind):
    draft = drafters(tiny_draft)[kind]
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=16, seed=11)
    alone = BatchEngine(tiny_target, draft, 3).generate_batch([PROMPTS[2]], params)[0].token_ids
    mates = [SamplingParams(max_new_tokens=5), SamplingParams(temperature=1.3, top_k=3, max_new_tokens=30),
             SamplingParams(temperature=0.5, max_new_tokens=9, seed=3)]
    crowded = BatchEngine(tiny_target, draft, 3).generate_batch(
        [PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[4]], [mates[0], params, mates[1], mates[2]])
    assert crowded[1].token_ids == alone
    # ... and it is the library's own seeded output with the same drafter and FixedK(K).
    library = SpeculativeDecoder(tiny_target, draft, 3, policy=FixedK(3)).generate(PROMPTS[2], params)
    assert library.token_ids == alone


def test_samples_of_one_request_follow_each_other_with_one_generator(tiny_target, tiny_draft):
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5, n=3)
    engine = BatchEngine(tiny_target, tiny_draft, 2)
    request = engine.add(PROMPTS[0], params)
    samples: dict[int, list[int]] = {}
    while engine.rows:
        for event in engine.step():
            assert event.request_id == request
            samples.setdefault(event.chunk.index, []).extend(event.chunk.token_ids)
    library = SpeculativeDecoder(tiny_target, tiny_draft, 2, policy=FixedK(2)).generate_choices(PROMPTS[0], params)
    assert [samples[i] for i in range(3)] == [out.token_ids for out in library]


def test_stop_tokens_and_max_tokens_end_rows_independently(tiny_target):
    reference = plain_greedy(tiny_target, PROMPTS[0], 12)
    stop = reference[4]
    outputs = BatchEngine(tiny_target, "ngram", 3).generate_batch(
        [PROMPTS[0], PROMPTS[0], PROMPTS[1]],
        [SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)), SamplingParams(max_new_tokens=3),
         SamplingParams(max_new_tokens=12)])
    assert outputs[0].token_ids == reference[: reference.index(stop) + 1] and outputs[0].finish_reason == "stop"
    assert outputs[1].token_ids == reference[:3] and outputs[1].finish_reason == "length"
    assert outputs[2].token_ids == plain_greedy(tiny_target, PROMPTS[1], 12)


def test_cancel_frees_the_row_at_once_and_the_others_go_on(tiny_target, tiny_draft):
    engine = BatchEngine(tiny_target, tiny_draft, 3)
    keep = engine.add(PROMPTS[0], SamplingParams(max_new_tokens=20))
    gone = engine.add(PROMPTS[3], SamplingParams(max_new_tokens=20))
    outputs: dict[int, list[int]] = {}
    run_until_done(engine, outputs, set(), steps=2)
    engine.cancel(gone)
    assert engine.rows == 1
    outputs.pop(gone)
    run_until_done(engine, outputs, set())
    assert outputs[keep] == plain_greedy(tiny_target, PROMPTS[0], 20)
    assert engine.cache_bytes == 0


def test_bad_requests_are_refused_before_any_work(tiny_target, tiny_draft):
    engine = BatchEngine(tiny_target, tiny_draft, 3)
    with pytest.raises(ContextLengthError, match="at most"):
        engine.add(PROMPTS[0], SamplingParams(max_new_tokens=1000))
    with pytest.raises(InvalidParameterError, match="token ids"):
        engine.add([99], SamplingParams(max_new_tokens=4))
    with pytest.raises(InvalidParameterError, match="tokenizer"):
        engine.add([1], SamplingParams(max_new_tokens=4, stop=("x",)))
    with pytest.raises(InvalidParameterError, match="empty"):
        engine.add([], SamplingParams(max_new_tokens=4))
    assert engine.rows == 0
    with pytest.raises(InvalidParameterError, match="trees, trained heads"):
        BatchEngine(tiny_target, "eagle:/nowhere")


def test_the_cache_rolls_back_by_length_and_moves_the_last_row_into_a_freed_one(tiny_target):
    cache = BatchKVCache(tiny_target.module.config, torch.float32, torch.device("cpu"))
    for _ in range(3):
        cache.add_row()
    positions, mask = cache.begin_forward(0, [2, 1, 3], 3)
    cache.end_forward([2, 1, 3])
    assert positions.tolist() == [[0, 1, 2]] * 3 and mask.shape == (3, 1, 3, 3)
    assert cache.lengths == [2, 1, 3]
    cache.truncate(2, 1)
    positions, mask = cache.begin_forward(1, [1, 2], 2)
    cache.end_forward([1, 2])
    # Row 1 (length 1) feeds at positions 1, 2; row 2 (rolled back to 1) as well.
    assert positions.tolist() == [[1, 2], [1, 2]] and cache.lengths == [2, 2, 3]
    allowed = (mask[:, 0] == 0).tolist()
    assert allowed[0] == [[True, True, False], [True, True, True]]
    assert cache.remove_row(0) == 2 and cache.lengths == [3, 2]


def test_rows_get_buffers_from_their_first_forward(tiny_target):
    cache = BatchKVCache(tiny_target.module.config, torch.float32, torch.device("cpu"))
    cache.add_row()
    assert cache.capacity == (0, 0)  # a draft model's row that never drafts costs nothing
    cache.begin_forward(0, [2], 2)
    cache.end_forward([2])
    for _ in range(8):  # past the reserved block of rows, none fed
        cache.add_row()
    assert cache.capacity[0] < cache.rows
    assert cache.remove_row(1) == 8 and cache.lengths == [2] + [0] * 7  # moving an unfed row copies nothing
    cache.begin_forward(0, [1] * 8, 1)  # the forward reserves every row it feeds
    cache.end_forward([1] * 8)
    assert cache.capacity[0] >= 8 and cache.lengths == [3] + [1] * 7


def test_the_n_gram_index_proposes_what_prompt_lookup_proposes():
    import random

    from quickdraft.drafters import PromptLookupDrafter
    from quickdraft.drafters.prompt_lookup import NgramIndex, continuations

    lookup, rng = PromptLookupDrafter(), random.Random(0)
    for _ in range(300):
        sequence = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        index = NgramIndex(sequence[:5])
        index.extend(sequence[5:])  # grown in two parts, as a row grows
        k = rng.randrange(1, 6)
        # The reference: the scan of the whole sequence, latest match of the longest n-gram.
        scanned = next((sequence[start:start + k] for start in continuations(sequence, 3, 1)), [])
        assert index.propose(k) == scanned, (sequence, k)
        assert lookup.propose(sequence, k, SamplingParams(), None).tokens.tolist() == scanned, (sequence, k)


def test_each_row_drafts_over_its_own_prompts_vocabulary(tiny_draft):
    shared_size = 3
    vocabulary = BatchOutputRows(tiny_draft, shared_size)
    prompts = [[6, 1], [5], [4, 4, 2, 0]]
    hidden = torch.randn(len(prompts), tiny_draft.module.config.hidden_size)  # [n, H]
    logits = vocabulary.logits(hidden, [vocabulary.own_rows(p) for p in prompts])  # [n, V]
    weight = tiny_draft.module.get_output_embeddings().weight
    for i, prompt in enumerate(prompts):
        rows = draft_vocabulary(tiny_draft, shared_size, prompt)
        expected = OutputRows(weight, rows, tiny_draft.vocab_size).logits(hidden[i : i + 1])[0]
        assert torch.isfinite(logits[i]).nonzero().flatten().tolist() == rows.tolist()
        torch.testing.assert_close(logits[i], expected)


def test_a_draft_over_part_of_the_vocabulary_is_still_exact(tiny_target, tiny_draft, monkeypatch):
    # The demo draft's vocabulary is large enough to be cut (``draft_vocabulary_size``); the tiny
    # one's is not: cut it to 3 tokens + each prompt's own.
    monkeypatch.setattr("quickdraft.batch.draft_model.draft_vocabulary_size", lambda model: 3)
    engine = BatchEngine(tiny_target, tiny_draft, 3, policy=FixedK(3), prompt_lookup=False)
    lengths = [20, 9, 14]
    outputs = engine.generate_batch(PROMPTS[:3], [SamplingParams(max_new_tokens=n) for n in lengths])
    assert all(o.stats.drafted_tokens > 0 for o in outputs)
    for output, prompt, n in zip(outputs, PROMPTS, lengths):
        assert output.token_ids == plain_greedy(tiny_target, prompt, n)
    # Sampled and seeded: the library's decoder with a draft over the same tokens draws the same.
    params = SamplingParams(temperature=0.9, max_new_tokens=16, seed=11)
    batched = engine.generate_batch([PROMPTS[1], PROMPTS[0]], params)[0].token_ids  # drafts over 0, 1, 2, 5
    drafter = DraftModelDrafter(tiny_draft, vocabulary_size=3, context_window=DEFAULT_DRAFT_CONTEXT_WINDOW)
    library = SpeculativeDecoder(tiny_target, drafter, 3, policy=FixedK(3)).generate(PROMPTS[1], params)
    assert library.token_ids == batched


def test_lookup_copies_and_model_drafts_are_judged_by_their_own_acceptance(tiny_target):
    # The target drafting for itself: greedy model drafts are always accepted; no lookup ran.
    engine = BatchEngine(tiny_target, tiny_target, 3, policy=FixedK(3), prompt_lookup=False)
    prior = engine.acceptance
    engine.generate_batch(PROMPTS[:2], SamplingParams(max_new_tokens=40))
    assert engine.acceptance[MODEL] > 0.9 and engine.acceptance[LOOKUP] == prior[LOOKUP]
    ngram = BatchEngine(tiny_target, "ngram", 3, policy=FixedK(3))
    ngram.generate_batch([PROMPTS[3]], SamplingParams(max_new_tokens=20))
    assert ngram.acceptance[LOOKUP] != prior[LOOKUP] and ngram.acceptance[MODEL] == prior[MODEL]


def test_a_copy_is_taken_only_where_it_is_expected_to_beat_the_draft_model(tiny_target):
    prompt = [4, 4, 2, 6] * 6  # prompt lookup always has a copy
    engine = BatchEngine(tiny_target, tiny_target, 3, policy=FixedK(3))
    engine._acceptance[LOOKUP].value, engine._acceptance[MODEL].value = 0.2, 0.9
    out = engine.generate_batch([prompt], SamplingParams(max_new_tokens=12))[0]
    assert out.stats.lookup_steps == 0 and out.stats.drafted_tokens > 0
    engine._acceptance[LOOKUP].value, engine._acceptance[MODEL].value = 1.0, 0.1
    assert engine.generate_batch([prompt], SamplingParams(max_new_tokens=12))[0].stats.lookup_steps > 0


def test_the_draft_forwards_span_only_the_rows_that_draft(tiny_target, tiny_draft):
    engine = BatchEngine(tiny_target, tiny_draft, 3, policy=FixedK(3), prompt_lookup=False)
    for prompt in PROMPTS:
        engine.add(prompt, SamplingParams(max_new_tokens=8, temperature=0.0))
    drafter = engine._drafter

    def ask(i: int, k: int) -> RowAsk:
        row = engine._rows[i]
        return RowAsk(i, row.sequence, k, row.params, None, row.processor)

    first, third = (d.tokens.tolist() for d in drafter.propose_rows([ask(0, 2), ask(2, 3)]).drafts)
    assert first == plain_greedy(tiny_draft, PROMPTS[0], 2)  # row 1, between them, does not draft
    assert third == plain_greedy(tiny_draft, PROMPTS[2], 3)
    assert drafter.runner.cached_ids[1] == []
    again = drafter.propose_rows([ask(2, 2)]).drafts[0].tokens.tolist()  # a span starting past row 0
    assert again == plain_greedy(tiny_draft, PROMPTS[2], 2)
    assert drafter.runner.cached_ids[0] == PROMPTS[0] + first[:1] and drafter.runner.cached_ids[1] == []


def test_rows_far_apart_are_fed_in_forwards_of_their_own(tiny_target):
    runner = BatchRunner(tiny_target)
    for _ in range(8):
        runner.add_row()
    # Rows 0 and 1 together (no padding); row 7 alone: over rows 0..7, 6 of 8 rows would be padding.
    assert forward_some(runner, {0: [1, 2], 1: [3, 4], 7: [5, 6]}) == 2 * 2 + 2
    assert runner.forwards == 2
    assert runner.cached_ids[:2] == [[1, 2], [3, 4]] and runner.cached_ids[7] == [5, 6]
    # Rows 2 and 4, one row between: half the positions are real, one forward; the lean
    # forward's linear layers compute the two real positions only (three through transformers).
    assert runner.ragged
    assert forward_some(runner, {2: [1], 4: [2]}) == 2
    assert runner.forwards == 3 and runner.cached_ids[3] == []


def test_in_a_probe_step_one_row_drafts_with_the_model(tiny_target, tiny_draft):
    # Verification dear enough that the policy never chooses to draft (k = 1 at a = 0.5: 1.02x
    # plain, short of the margin), though drafts all accepted would pay: every other step probes
    # (probes may take any share of the time).
    policy = GoodputPolicy(3, Curve(verify=lambda positions: 1.0 + 0.3 * positions), probe_every=2, max_probe_every=2,
                           probe_share=1.0)
    engine = BatchEngine(tiny_target, tiny_draft, 3, policy=policy, prompt_lookup=False)
    ids = [engine.add(prompt, SamplingParams(max_new_tokens=12)) for prompt in PROMPTS[:3]]
    outputs: dict[int, list[int]] = {}
    probes = 0
    while engine.rows:
        for event in engine.step():
            outputs.setdefault(event.request_id, []).extend(event.chunk.token_ids)
        if engine.last_decision.probing:
            probes += 1
            assert sorted(engine.last_drafted) == [0] * (len(engine.last_drafted) - 1) + [1]
        else:
            assert set(engine.last_drafted) <= {0}
    assert probes > 2
    assert [outputs[i] for i in ids] == [plain_greedy(tiny_target, p, 12) for p in PROMPTS[:3]]

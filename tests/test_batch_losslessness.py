"""One row's sampled continuations under batching follow the target's exact distribution.

As tests/test_losslessness.py, with a vocabulary of 8 and 3 new tokens (512 continuations whose
exact probability is enumerated), but every sample comes out of a batch: eight rows of the
prompt under test side by side with rows of other lengths and other parameters (greedy, another
temperature with top-k), some still prefilling, while the policy changes how many tokens the
batch drafts from step to step (0, 2, 1, ...), so rows verify drafts of different lengths in
one forward. The rows are unseeded (so the policy's k applies to them); ``random.seed`` fixes
the seeds the engine draws, which makes the test deterministic.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from conftest import chi_square_p_value, exact_continuation_probs
from quickdraft import FixedK, SamplingParams
from quickdraft.batch import BatchEngine, Decision, RowOutlook

PROMPT = [3, 1]
LENGTH = 3
ROWS = 8
SAMPLES = 3000
MATES = [
    ([0, 7, 7, 1, 2, 6, 3, 3, 4], SamplingParams(max_new_tokens=5)),
    ([5], SamplingParams(temperature=0.6, top_k=3, max_new_tokens=7)),
    ([2, 2, 6, 1] * 5, SamplingParams(temperature=1.2, top_p=0.8, max_new_tokens=4)),
]


class CyclingK(FixedK):
    """A policy that drafts 0, 2, 1, 0, 2, 1, ... tokens: ragged steps, some without drafts."""

    def __init__(self) -> None:
        super().__init__(2)
        self._cycle = itertools.cycle([0, 2, 1])

    def decide(self, rows: list[RowOutlook], joining: int = 0, ragged: bool = False) -> Decision:
        self.k = next(self._cycle)
        return super().decide(rows, joining, ragged)


def batched_counts(engine: BatchEngine, params: SamplingParams, vocab: int) -> torch.Tensor:
    """Counts of each continuation of PROMPT over SAMPLES rows, ROWS per batch."""
    random.seed(0)
    counts = torch.zeros(vocab**LENGTH)
    for _ in range(SAMPLES // ROWS):
        mates = [engine.add(prompt, mate) for prompt, mate in MATES[:2]]
        tested = [engine.add(PROMPT, params) for _ in range(ROWS)]
        mates.append(engine.add(*MATES[2]))  # joins last: it prefills while the others decode
        outputs: dict[int, list[int]] = {i: [] for i in tested}
        while engine.rows:
            for event in engine.step():
                if event.request_id in outputs:
                    outputs[event.request_id].extend(event.chunk.token_ids)
        for ids in outputs.values():
            assert len(ids) == LENGTH
            counts[(ids[0] * vocab + ids[1]) * vocab + ids[2]] += 1
    return counts


@pytest.mark.parametrize("kind,temperature,top_k,top_p", [
    ("draft model", 1.0, 0, 1.0),
    ("ngram", 0.8, 0, 0.9),
    ("draft model", 1.3, 4, 1.0),
])
def test_a_row_in_a_mixed_batch_samples_from_the_target(tiny_target, tiny_draft, kind, temperature, top_k, top_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=LENGTH)
    draft = tiny_draft if kind == "draft model" else "ngram"
    engine = BatchEngine(tiny_target, draft, num_speculative_tokens=2, policy=CyclingK(), prefill_chunk_tokens=6)
    counts = batched_counts(engine, params, tiny_target.vocab_size)
    assert chi_square_p_value(counts, exact_continuation_probs(tiny_target, PROMPT, LENGTH, params)) > 1e-3
    # The control: the same samples against the draft's distribution must fail, so the test
    # has the power to see a sampler that follows the wrong model.
    wrong = exact_continuation_probs(tiny_draft, PROMPT, LENGTH, params)
    assert chi_square_p_value(counts, wrong) < 1e-6

"""Many generations at once: one target forward per step verifies every running row's draft.

Each step runs, in named phases (``BatchEngine.step``):

1. **prefill**: rows that joined feed their prompt to the target, together in one forward of at
   most ``prefill_chunk_tokens`` tokens over all joining rows, so running rows wait at most one
   chunk's forward per step; what another row's cache holds of a prompt is copied, not computed;
2. **draft**: every decoding row takes prompt lookup's copy when it has one (one-hot ``q``) and
   copies are expected to get as many tokens accepted as the drafter's, else the drafter's
   tokens, each row drawing from its own ``q`` with its own generator; how many is the
   policy's choice for the batch (``quickdraft.batch.policy``);
3. **verify**: one target forward over every row's ``[last token, drafts...]``, padded to the
   longest (``quickdraft.batch.cache``);
4. **accept**: each row applies ``verify_greedy`` / ``verify_sampled`` to its own rows of
   logits, processed by its own ``LogitsProcessor``, with its own ``torch.Generator``;
5. **commit**: each row's emitted tokens join its sequence (stop tokens, stop strings and
   ``max_new_tokens`` end a row, whose cache rows are freed at once, as on ``cancel``); the
   target's cache is cut back to the sequence, which rolls the rejected drafts back, and the
   draft model's to what it read of it (``_commit``).

Rows are exactly the single-sequence loop's (``quickdraft.engine``) side by side: the same
acceptance rule, processing and sampling per row, so each row's output is distributed as the
target's own sampling whatever else is in the batch. A **seeded sampled** row follows the seed
rule (``quickdraft.engine.SEEDED_RULE``): it drafts a fixed k (``min(K, ...)``, as ``FixedK``)
instead of the batch's choice, whatever the batch's size (``k_by_batch_size`` does not lower
it), so its seed gives the same text in any batch and from ``SpeculativeDecoder``.

Drafters: none (plain batched decoding); ``"ngram"`` (prompt lookup, a ``PromptLookupDrafter``
and its n-gram index per row, also in front of the drafters below unless ``prompt_lookup=False``);
and behind one batch-shaped call (``propose_rows``) a draft model sharing the target's tokenizer
(``BatchedDraftModel``: one batched draft forward per drafted position over the rows that
draft) or any other ``Drafter`` (a draft model of another tokenizer, EAGLE and
Medusa heads, a user's drafter), which drafts for each row in turn through a fork of it per row
(``RowDrafters``), fed the target's features of the row where it drafts from them. Trees are not verified
here: ``RowDrafters`` cuts a tree to its first branch, and the server decodes a decoder that
drafts trees one request at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.batch.draft_model import BatchedDraftModel
from quickdraft.batch.limits import KByBatchSize
from quickdraft.batch.policy import BatchPolicy, GoodputPolicy
from quickdraft.batch.runner import BatchRunner, forward_some, timed_forwards, waits_for
from quickdraft.config import SamplingParams
from quickdraft.costs import RowOutlook, expected_tokens
from quickdraft.drafters import PromptLookupDrafter
from quickdraft.drafters.base import Draft, Drafter, RowAsk, RowDrafters
from quickdraft.drafters.forced import after_forced, free_copy
from quickdraft.drafters.lookup_first import Lookup
from quickdraft.drafters.registry import draft_model_drafter
from quickdraft.engine import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    GenerationOutput,
    Row,
    StreamChunk,
    TokenLogprob,
    check_fits,
    new_generator,
    new_processor,
    token_logprobs,
)
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.models.tokenizers import shares_token_ids
from quickdraft.policy import LOOKUP, MODEL, Acceptance, Decision
from quickdraft.processing import LogitsProcessor
from quickdraft.sampling import logits_to_probs
from quickdraft.verify import StepResult, verify_greedy, verify_sampled

DEFAULT_PREFILL_CHUNK_TOKENS = 512
# With a draft model, copies found by prompt lookup are taken after this many steps without
# any, whatever their acceptance was: a passage that copies its context is then noticed.
LOOKUP_PROBE_EVERY = 16
# Positions one target forward is timed over when the engine starts with a draft model
# (``_time_forwards``; the draft's rows: ``BatchedDraftModel.start_up_timings``).
TARGET_TIMING_POSITIONS = (16, 32, 64, 128)
# A step's phases (module docstring; the draft phase includes the draft model's catch-up, the
# accept phase the commit).
PHASES = ("prefill", "draft", "verify", "accept")

# One line a step at DEBUG (``quickdraft serve --log-level debug``): what the policy saw and
# chose, and what the step cost.
logger = logging.getLogger("quickdraft.batch")


@dataclass
class _Request:
    """One ``add``: ``params.n`` samples, decoded one after the other in one row."""

    id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator  # shared by the samples, as SpeculativeDecoder does
    sample: int = 0
    scope: str | None = None  # whose earlier requests its lookup may draft from (``add``)


@dataclass
class _Row(Row):
    """One sample being decoded (``quickdraft.engine.Row``), and what the batch keeps of it."""

    request: _Request | None = None
    lookup: Lookup | None = None  # prompt lookup or the suffix cache, a fork per row
    prefilled: int = 0  # prompt tokens (of all but the last) the target holds

    @property
    def prefill_left(self) -> int:
        return len(self.request.prompt_ids) - 1 - self.prefilled

    def cap(self, most: int) -> int:
        """The most tokens it may draft this step where its request and the step allow ``most``
        (``BatchEngine._row_k``): never past ``max_new_tokens`` (a step emits up to k + 1 tokens)."""
        return min(most, self.remaining - 1)

    @property
    def pinned(self) -> bool:
        """Seeded sampling: its k must not depend on the batch (module docstring)."""
        return self.params.seed is not None and not self.params.greedy


@dataclass(frozen=True)
class Event:
    """A step's output for one request: ``chunk.finish_reason`` set on each sample's last chunk;
    ``done`` on the request's very last."""

    request_id: int
    chunk: StreamChunk
    done: bool = False


class BatchEngine:
    """Decodes many requests at once, each exactly as the target alone would.

    Args:
        target: the model whose output distribution is kept.
        draft: ``None`` (plain batched decoding), ``"ngram"`` (prompt lookup), a draft
            ``LoadedModel`` (with another tokenizer: ``CrossTokenizerDrafter``, row by row) or
            any ``Drafter`` (row by row, ``RowDrafters``).
        num_speculative_tokens: K, the most tokens a row drafts per step.
        policy: chooses k each step (default ``GoodputPolicy``; ``FixedK(K)`` always drafts K).
        prompt_lookup: with a drafter, try a prompt-lookup copy first (default True); a
            ``Lookup`` (a ``SuffixDrafter``) drafts the copies instead, with or without a
            drafter behind it.
        prefill_chunk_tokens: prompt tokens fed per step over all joining rows.
        k_by_batch_size: a ceiling on k by the number of running requests (decoding or still
            reading their prompts), ``KByBatchSize``; a seeded sampled row keeps its fixed k
            (module docstring). None: K at every size.

    Not thread-safe: one thread calls ``add``, ``cancel`` and ``step``.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | Drafter | str | None = None,
        num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
        policy: BatchPolicy | None = None,
        prompt_lookup: bool | Lookup = True,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        k_by_batch_size: KByBatchSize | None = None,
    ) -> None:
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise InvalidParameterError(f"num_speculative_tokens (K) must be an integer >= 1, got {num_speculative_tokens}")
        if prefill_chunk_tokens < 1:
            raise InvalidParameterError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        if isinstance(draft, str) and draft != "ngram":
            raise InvalidParameterError(
                f"the batched engine takes a draft model, 'ngram', a Drafter or None, got {draft!r}: build "
                "trees, trained heads and the other kinds with quickdraft.drafters.make_drafter")
        if isinstance(draft, LoadedModel) and not shares_token_ids(target, draft):
            draft = draft_model_drafter(draft, target, None)  # drafts the shared tokens, row by row
        self.target = target
        # What drafts for the rows besides prompt lookup: a draft model with the target's tokens
        # in batched forwards, any other drafter through a fork of it per row.
        self._drafter: BatchedDraftModel | RowDrafters | None = (
            BatchedDraftModel(draft) if isinstance(draft, LoadedModel)
            else RowDrafters(draft) if isinstance(draft, Drafter) else None)
        self._models_draft = self._drafter is not None
        self.num_speculative_tokens = num_speculative_tokens
        self.policy = policy if policy is not None else GoodputPolicy(num_speculative_tokens)
        # The free copies: prompt lookup (``"ngram"``, or in front of a drafter), or the lookup
        # given; each row drafts through its own fork of it.
        self._lookups: Lookup | None = (
            PromptLookupDrafter() if draft == "ngram" or (prompt_lookup is True and self._models_draft)
            else prompt_lookup if not isinstance(prompt_lookup, bool) else None)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.k_by_batch_size = k_by_batch_size
        self._target = BatchRunner(target, keep_features=self._models_draft and self._drafter.needs_target_features)
        self._rows: list[_Row] = []  # index = the row in the target's and the drafter's caches
        self._next_id = 0
        # Over every row's drafts: a request is too short to learn its own acceptance (32 tokens
        # at 1.1 per step), and how well drafts match is mostly the workload's and the drafter's.
        # One per source: lookup copies of chat prompts were accepted far more often than the
        # draft model's tokens, and a pooled rate let the model draft where it did not pay.
        self._acceptance = {source: Acceptance() for source in (LOOKUP, MODEL)}
        # A row's first step apart (``_accept``): an answer's first tokens are the least predictable.
        self._first_acceptance = {source: Acceptance() for source in (LOOKUP, MODEL)}
        self._context_length = target.context_length
        if self._models_draft and self._drafter.context_length is not None:
            self._context_length = min(self._context_length, self._drafter.context_length)
        self.last_drafted: list[int] = []  # tokens each row drafted in the last step (metrics)
        self.last_decision = Decision(0, ())  # what the policy chose for the last step (metrics)
        # Seconds the last step spent in each phase (``PHASES``; metrics): where a loaded
        # server's time goes, and what the steps that drafted cost.
        self.last_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._steps_without_copies = 0  # steps since a row last drafted a lookup copy
        self._probe_lookup = False  # this step takes every copy (``_lookup``)
        self._caught_up = 0  # positions the draft model read catching up this step (DEBUG line)
        self._time_forwards()

    @torch.inference_mode()
    def _time_forwards(self) -> None:
        """Time a draft-model forward over each of ``DRAFT_TIMING_ROWS`` rows and a target forward
        over each of ``TARGET_TIMING_POSITIONS`` (one token a row, in caches of their own), for
        the policy's ``draft(rows)`` (and its estimate of a catch-up over as many positions,
        ``MeasuredCosts.catch_up``) and ``verify(positions)`` (their shape: the steps' timings set
        their level, ``MeasuredCosts``), so that a batch's choices are grounded before it first
        drafts: a draft forward over 32 rows can cost 3x one over a row, so it cannot be taken
        from one row's, and a curve interpolated from the few sizes a batch happens to run
        misprices the others. It takes about a second, and warms the kernels up. A drafter
        without start-up timings (``RowDrafters``) is timed by the steps alone."""
        draft = None if self._drafter is None else self._drafter.start_up_timings()
        if draft is not None:
            self.policy.observe_start_up(dict(timed_forwards(self.target, TARGET_TIMING_POSITIONS, None)), draft)

    # -- requests ------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows decoding or prefilling now (one per running request)."""
        return len(self._rows)

    @property
    def acceptance(self) -> dict[str, float]:
        """The running probability that a drafted token is accepted, by source (``LOOKUP``, ``MODEL``)."""
        return {source: rate.value for source, rate in self._acceptance.items()}

    @property
    def cache_bytes(self) -> int:
        """Bytes the KV caches of the target and the drafter hold now."""
        positions = sum(len(row.sequence) for row in self._rows)
        return self._target.cache.nbytes + (self._drafter.cache_bytes(positions) if self._models_draft else 0)

    def slots_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Cache positions a request may need: prompt, output and one step's padded drafts."""
        return prompt_len + max_new_tokens + self.num_speculative_tokens + 1

    def bytes_per_slot(self) -> int:
        """Bytes one cache position of one row takes in every model."""
        return self._target.cache.bytes_per_slot + (self._drafter.bytes_per_slot if self._models_draft else 0)

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> LogitsProcessor:
        """Raise what ``add`` would for this request (before any work); returns its processor."""
        vocab = self.target.vocab_size
        if not prompt_ids:
            raise InvalidParameterError("the prompt is empty: give at least one token")
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise InvalidParameterError(f"prompt token ids must be in [0, {vocab})")
        check_fits(self._context_length, len(prompt_ids), params.max_new_tokens)
        if params.stop and self.target.tokenizer is None:
            raise InvalidParameterError("stop strings need a model with a tokenizer")
        return new_processor(self.target, prompt_ids, params)

    def add(self, prompt: str | Sequence[int], params: SamplingParams | None = None, scope: str | None = None) -> int:
        """Start a request (text or token ids); returns its id for ``step``'s events and ``cancel``.
        ``scope``: whose earlier requests a suffix cache drafts from for it (None: the lookup's own).

        Raises (before any work): ``ContextLengthError``, ``InvalidParameterError`` as
        ``SpeculativeDecoder.stream`` does.
        """
        params = params or SamplingParams()
        prompt_ids = self._encode(prompt)
        processor = self.check(prompt_ids, params)
        request = _Request(self._next_id, prompt_ids, params, new_generator(params, self.target.device), scope=scope)
        self._next_id += 1
        self._join(request, processor)
        return request.id

    def cancel(self, request_id: int) -> None:
        """Stop a request now and free its cache rows (no more events for it)."""
        for index, row in enumerate(self._rows):
            if row.request.id == request_id:
                self._remove(index)
                return

    def release(self) -> None:
        """Cancel every request and free the caches."""
        while self._rows:
            self._remove(len(self._rows) - 1)

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.target.tokenizer is None:
                raise InvalidParameterError(f"{self.target.name} has no tokenizer: pass the prompt as a list of token ids")
            return self.target.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return [int(t) for t in prompt]

    def _join(self, request: _Request, processor: LogitsProcessor) -> None:
        row = _Row.start(self.target, request.prompt_ids, request.params, processor, request=request)
        if self._lookups is not None:
            row.lookup = self._lookups.fork(request.scope)
            row.lookup.sync(row.sequence)  # the prompt is there for the other rows at once
        if self._models_draft:
            self._drafter.add_row(request.prompt_ids, [other.sequence for other in self._rows])
        self._rows.append(row)
        self._target.add_row()

    def _remove(self, index: int) -> None:
        if self._models_draft:
            self._drafter.remove_row(index)
        self._target.remove_row(index)
        last = self._rows.pop()
        if index < len(self._rows):
            self._rows[index] = last
        # The remaining rows' needs bound what the caches keep (the server's budget counts on it).
        slots = max((self._slots_needed(row) for row in self._rows), default=0)
        self._target.cache.shrink(slots)
        if self._models_draft:
            self._drafter.shrink(slots)

    def _slots_needed(self, row: _Row) -> int:
        return self.slots_needed(len(row.request.prompt_ids), row.params.max_new_tokens)

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Run one step (module docstring); returns what each request emitted."""
        clock = time.perf_counter()
        self._prefill()
        prefill_seconds = time.perf_counter() - clock
        self.last_seconds = dict.fromkeys(PHASES, 0.0)
        self.last_seconds["prefill"] = prefill_seconds
        self._caught_up = 0
        decoding = [i for i, row in enumerate(self._rows) if row.prefill_left == 0]
        if not decoding:
            self.last_drafted = []
            return []
        clock = time.perf_counter()

        # Draft.
        k = self.num_speculative_tokens if self.k_by_batch_size is None else \
            self.k_by_batch_size.limit(len(self._rows), self.num_speculative_tokens)
        self._probe_lookup = self._steps_without_copies >= LOOKUP_PROBE_EVERY
        # Per row: the grammar's forced tokens, and the free copy (them, then the lookup's copy).
        forced, lookups = {}, {}
        for i in decoding:
            forced[i], lookups[i] = self._lookup(self._rows[i], k)
        self._steps_without_copies = 0 if any(lookups.values()) else self._steps_without_copies + 1
        # What the draft model reads for each decoding row (the policy's estimate of catch-ups)
        reading = {i: self._drafter.view(i, self._rows[i].sequence) for i in decoding
                   if self._models_draft and self._row_k(self._rows[i], k)}
        outlooks = [self._outlook(i, lookups[i], reading, k) for i in decoding]
        # How a verification's cost grows with its rows' drafts: their own positions where the
        # target's forward skips the padding (``ragged``), rows x the longest where it does not.
        decision = self.policy.decide(outlooks, joining=len(self._rows) - len(decoding), ragged=self._target.ragged)
        self.last_decision = decision
        drafts: dict[int, tuple[list[int], torch.Tensor | None, bool]] = {}  # row -> tokens, q, from lookup
        model_rows: dict[int, int] = {}
        for i, outlook, n in zip(decoding, outlooks, decision.drafts):
            forced[i] = forced[i][:n]
            if lookups[i]:
                drafts[i] = (lookups[i][:n], None, True)
            elif n and outlook.model:
                model_rows[i] = n
            else:
                drafts[i] = ([], None, False)
                forced[i] = []
        timed_forwards, timed_seconds = self._draft_rows(model_rows, forced, drafts)
        draft_seconds, clock = time.perf_counter() - clock, time.perf_counter()

        # Verify: one forward over [last token, drafts...] of every decoding row.
        sequences: list[list[int] | None] = [None] * len(self._rows)
        num_logits = [0] * len(self._rows)
        for i in decoding:
            sequences[i] = self._rows[i].sequence + drafts[i][0]
            num_logits[i] = len(drafts[i][0]) + 1
        computed = self._target.positions
        logits = self._target.forward_tails(0, sequences, num_logits)
        computed = self._target.positions - computed
        verify_seconds, clock = time.perf_counter() - clock, time.perf_counter()

        # Accept and commit, row by row.
        events: list[Event] = []
        finished: list[int] = []
        # (source, a row's first step?) -> [accepted, tried] this step
        outcomes = {(source, first): [0, 0] for source in (LOOKUP, MODEL) for first in (False, True)}
        self.last_drafted = [len(drafts[i][0]) for i in decoding]
        for i in decoding:
            row = self._rows[i]
            tokens, probs, from_lookup = drafts[i]
            first = row.stats.steps == 0
            row.stats.time_prefill += prefill_seconds if first else 0.0
            row.stats.time_draft += draft_seconds
            row.stats.time_verify += verify_seconds
            event = self._accept(row, tokens, probs, from_lookup, len(forced[i]), logits[i],
                                 outcomes[LOOKUP if from_lookup else MODEL, first])
            events.append(event)
            if row.lookup is not None:
                row.lookup.sync(row.sequence)
            if event.chunk.finish_reason is not None:
                finished.append(i)
            else:
                self._commit(i)
        for (source, first), (accepted, tried) in outcomes.items():
            if tried:
                (self._first_acceptance if first else self._acceptance)[source].add(accepted / tried, count=tried)
        other = time.perf_counter() - clock
        for i in decoding:
            self._rows[i].stats.time_other += other
        self.last_seconds.update(draft=draft_seconds, verify=verify_seconds, accept=other)
        # Checking each row's drafts (processing, acceptance, commit) grows with them: it is
        # part of what verifying the positions costs.
        # The draft forwards' cost is recorded for the rows that drafted with the model: a
        # probe's one row drafting, recorded as the whole batch's, made drafting with every row
        # look as cheap as that.
        self.policy.observe_timings(computed, verify_seconds + other, len(model_rows), timed_forwards, timed_seconds)
        self.policy.delivered(draft_seconds + verify_seconds + other,
                              sum(len(event.chunk.token_ids) for event in events),
                              outcomes[MODEL, False][0] + outcomes[MODEL, True][0])
        if logger.isEnabledFor(logging.DEBUG):
            self._log_step(len(decoding), events)
        for i in sorted(finished, reverse=True):  # highest first: removal moves the last row
            self._finish(i, events)
        return events

    def _log_step(self, decoding: int, events: list[Event]) -> None:
        """The step's DEBUG line (``logger``)."""
        decision, drafted = self.last_decision, self.last_drafted
        rates = "" if decision.rates is None else "; estimated %.1f tok/s, plain %.1f" % decision.rates
        logger.debug(
            "step: %d rows decoding, %d joining; k %d%s; %d rows drafted %d tokens, the draft model read %d "
            "positions catching up; %d tokens emitted%s; gain %.2f; seconds %s", decoding,
            len(self._rows) - decoding, decision.k, " (probe)" if decision.probing else "",
            sum(1 for d in drafted if d), sum(drafted), self._caught_up,
            sum(len(event.chunk.token_ids) for event in events), rates, decision.gain,
            " ".join(f"{phase} {seconds:.3f}" for phase, seconds in self.last_seconds.items()))

    def _prefill(self) -> None:
        """Feed joining rows' prompts (all but the last token) to the target, up to
        ``prefill_chunk_tokens`` in all, in one forward over those rows (rows in between that
        are decoding feed nothing). The draft model reads a prompt only when its row first
        drafts with it (``_catch_up``): where the batch does not draft, it never does.

        A prompt's beginning that another row holds is copied, not computed
        (``BatchRunner.share_prefix``): a chat template's system prompt, a repeated prompt. A
        row that a row fed this step would give ``MIN_SHARED_PREFIX`` tokens more waits for it
        (``waits_for``), so that requests joining at once compute a shared system prompt once."""
        budget = self.prefill_chunk_tokens
        chunks: dict[int, list[int]] = {}
        fed: list[list[int]] = []  # what the rows fed will hold of their prompts
        for index, row in enumerate(self._rows):
            if budget == 0:
                break
            if not row.prefill_left:
                continue
            prompt = row.request.prompt_ids[:-1]
            row.prefilled = self._target.share_prefix(index, prompt)
            if row.prefill_left and not waits_for(prompt, row.prefilled, fed):
                take = min(budget, row.prefill_left)
                chunks[index] = prompt[row.prefilled:row.prefilled + take]
                fed.append(prompt[:row.prefilled + take])
                budget -= take
        if not chunks:
            return
        forward_some(self._target, chunks)
        for index, chunk in chunks.items():
            row = self._rows[index]
            row.prefilled += len(chunk)
            row.stats.target_forwards += 1
            row.stats.target_positions += len(chunk)

    def _row_k(self, row: _Row, k: int) -> int:
        """The most tokens ``row`` may draft in a step whose ceiling is ``k`` (``k_by_batch_size``):
        its request's limit; a seeded sampled row's from K, so that its k does not depend on
        the batch."""
        return row.params.speculative_tokens(self.num_speculative_tokens if row.pinned else k)

    def _lookup(self, row: _Row, k: int) -> tuple[list[int], list[int]]:
        """The grammar's forced tokens for the row, and the free copy: them, then prompt
        lookup's copy (``drafters.forced.free_copy``; at most its k in a step whose ceiling is
        ``k``, ``_row_k``, and never past ``max_new_tokens``), or no copy where the draft
        model is expected to get more of its tokens accepted (it then drafts after the forced
        tokens). Nothing for a row that does not speculate (no drafter, or k 0).

        A seeded sampled row takes any copy (as ``FixedK`` does): which source drafts for it
        must not depend on the acceptance other rows measured. Every ``LOOKUP_PROBE_EVERY``
        steps without copies, the copies are taken, so that copies' acceptance is measured anew.
        """
        cap = row.cap(self._row_k(row, k))
        if (row.lookup is None and not self._models_draft) or cap < 1:
            return [], []
        # Prompt lookup ignores the sampling parameters: its q is one-hot. The forced tokens
        # alone are a copy but for a seeded row with a drafter to continue them (the seed rule).
        forced, copy = free_copy(row.processor, row.sequence, cap, None if row.lookup is None else row.lookup.chain_ids,
                                 alone=not (row.pinned and self._models_draft))
        if copy and self._models_draft and not row.pinned and not self._probe_lookup:
            acceptance = self.acceptance
            if expected_tokens(acceptance[LOOKUP], len(copy)) < expected_tokens(acceptance[MODEL], cap):
                return forced, []
        return forced, copy

    def _outlook(self, index: int, lookup: list[int], reading: dict[int, list[int]], k: int) -> RowOutlook:
        """What the policy knows of row ``index`` (``reading``: the draft sequences of the
        decoding rows by index, ``_behind``) in a step whose ceiling is ``k``."""
        row = self._rows[index]
        most = self._row_k(row, k)
        cap = row.cap(most)
        model = not lookup and self._models_draft and most > 0
        if not lookup and not model:
            cap = 0
        elif lookup:
            cap = len(lookup)
        fixed = cap if row.pinned else None
        source = LOOKUP if lookup else MODEL
        acceptance = self._acceptance[source]
        expected = (self._first_acceptance if row.stats.steps == 0 else self._acceptance)[source]
        return RowOutlook(cap=cap, acceptance=expected.value, model=model, fixed=fixed,
                          behind=self._drafter.behind(index, reading[index], reading) if model else 0,
                          remaining=row.remaining, prior=not acceptance.tried,
                          prompt=self._drafter.prompt_to_read(index) if model else 0,
                          budget=row.params.max_new_tokens)

    def _draft_rows(self, model_rows: dict[int, int], forced: dict[int, list[int]], drafts: dict) -> tuple[int, float]:
        """Draft ``model_rows[i]`` tokens for each row ``i``: its ``forced`` tokens (the grammar's),
        then the drafter's after them, each from its own q with its own generator
        (``BatchedDraftModel`` or ``RowDrafters.propose_rows``). Fills ``drafts``; the
        catch-ups the drafter read go to the policy.

        Returns the draft forwards run after the catch-ups and their seconds: what drafting
        costs the policy (timed with them, a catch-up would keep the batch from drafting again
        after a plain passage)."""
        if self._target.keep_features:
            # A head drafts from the target's features, which end with the sequence: it cannot
            # draft after tokens the target has not read, so the forced tokens go in copies only.
            forced.update((i, []) for i in model_rows)
        asks = []
        for i, k in model_rows.items():
            row = self._rows[i]
            if k == len(forced[i]):  # the forced tokens are the whole draft
                drafts[i] = (forced[i], None, False)
                continue
            # The target holds the sequence but its last token (``_commit``): the features of those.
            features = self._target.features(i, len(row.sequence) - 1) if self._target.keep_features else None
            asks.append(RowAsk(i, row.sequence + forced[i], k - len(forced[i]), row.params, row.request.generator,
                               row.processor.after(forced[i]), features))
        if not asks:
            return 0, 0.0
        drafted = self._drafter.propose_rows(asks)
        for ask, draft, (forwards, positions) in zip(asks, drafted.drafts, drafted.counts):
            i = ask.row
            draft = after_forced(forced[i], draft)
            tokens = draft.tokens.tolist()  # host sync: the verify forward takes ids
            probs = None if draft.probs is None else draft.probs.to(self.target.device)
            drafts[i] = (tokens, probs, False)
            self._rows[i].stats.draft_forwards += forwards
            self._rows[i].stats.draft_positions += positions
        for positions, seconds in drafted.catch_ups:
            self.policy.observe_catch_up(positions, seconds)
            self._caught_up += positions
        return drafted.forwards, drafted.seconds

    def _commit(self, index: int) -> None:
        """Keep in row ``index``'s caches what its sequence holds, roll the rest back: the target's
        cache keeps the sequence but its last token (fed with the next step's drafts), so the
        rejected drafts go; the drafter keeps what it read of the sequence."""
        row = self._rows[index]
        self._target.truncate(index, len(row.sequence) - 1)
        if self._models_draft:
            self._drafter.commit(index, row.sequence)

    def _accept(self, row: _Row, drafted: list[int], probs: torch.Tensor | None, from_lookup: bool, forced: int,
                raw: torch.Tensor, outcome: list[int]) -> Event:
        """Apply the acceptance rule to one row (its first ``forced`` drafts the grammar's) and
        commit what it emits; add its accepted and tried drafts to ``outcome`` (the caller's
        running acceptance for the row's source, one for rows' first steps and one for the rest:
        an answer's first tokens say little of the rest: a draft often misses a chat answer's
        opening token and then has most of the rest accepted, and one pooled rate would price
        every step at the openings' rate)."""
        params = row.params
        device = self.target.device
        draft_tokens = torch.tensor(drafted, dtype=torch.long, device=device)  # [k]
        logits = row.processor(raw, drafted)  # [k + 1, V]
        if params.greedy:
            result: StepResult = verify_greedy(draft_tokens, logits)
        else:
            result = verify_sampled(draft_tokens, probs, logits_to_probs(logits, params), row.request.generator)
        k, n = len(drafted), result.num_accepted
        outcome[0] += n
        outcome[1] += min(n + 1, k)  # position i was tried iff the ones before it were accepted
        row.stats.record_step(k, n, from_lookup and self._models_draft, forced)
        row.stats.target_forwards += 1
        row.stats.target_positions += k + 1
        new, text, finish_reason = row.emit(drafted[:n] + [result.next_token])
        logprobs = token_logprobs(logits[: len(new)], new, params) if params.logprobs else None
        chunk = StreamChunk(new, text, min(n, len(new)), finish_reason,
                            row.stats if finish_reason is not None else None, row.request.sample, logprobs)
        return Event(row.request.id, chunk, done=finish_reason is not None and row.request.sample == params.n - 1)

    def _finish(self, index: int, events: list[Event]) -> None:
        """A sample ended: free its row; the request's next sample (``n > 1``) joins anew."""
        request = self._rows[index].request
        self._remove(index)
        if request.sample < request.params.n - 1:
            request.sample += 1
            self._join(request, new_processor(self.target, request.prompt_ids, request.params))

    # -- whole generations -----------------------------------------------------------------------

    def generate_batch(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[GenerationOutput]:
        """Generate a continuation of every prompt, all in one batch; ``params`` is one for all or
        one per prompt (``n`` must be 1: use ``add`` / ``step`` for more samples)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidParameterError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        if any(p.n != 1 for p in params):
            raise InvalidParameterError("generate_batch returns one sample per prompt: use n=1 (or add / step)")
        ids = [self.add(prompt, p) for prompt, p in zip(prompts, params)]
        tokens: dict[int, list[int]] = {i: [] for i in ids}
        texts: dict[int, list[str]] = {i: [] for i in ids}
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in ids}
        outputs: dict[int, GenerationOutput] = {}
        while len(outputs) < len(ids):
            for event in self.step():
                chunk = event.chunk
                tokens[event.request_id].extend(chunk.token_ids)
                texts[event.request_id].append(chunk.text)
                logprobs[event.request_id].extend(chunk.logprobs or [])
                if event.done:
                    p = params[ids.index(event.request_id)]
                    outputs[event.request_id] = GenerationOutput(
                        "".join(texts[event.request_id]), tokens[event.request_id], chunk.finish_reason, chunk.stats,
                        logprobs[event.request_id] if p.logprobs else None)
        return [outputs[i] for i in ids]


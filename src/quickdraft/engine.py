"""The decoding loop: draft, verify, accept, commit. Plain decoding is the same loop with K = 0."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft
from quickdraft.drafters.forced import after_forced, free_copy
from quickdraft.drafters.lookup_first import Lookup
from quickdraft.drafters.registry import Spec, make_drafter
from quickdraft.errors import ContextLengthError, InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.policy import LOOKUP, AdaptiveK, FixedK, SpeculationPolicy
from quickdraft.processing import LogitsProcessor
from quickdraft.runner import ModelRunner
from quickdraft.sampling import log_probs, logits_to_probs
from quickdraft.stats import DecodeStats
from quickdraft.text import Detokenizer
from quickdraft.tree import TreeSpec
from quickdraft.verify import StepResult, verify_greedy, verify_sampled
from quickdraft.verify_tree import TreeStepResult, verify_tree_greedy, verify_tree_sampled

DEFAULT_NUM_SPECULATIVE_TOKENS = 5

# Which random numbers a sampled generation draws depends on how many tokens each step drafts
# and from which source. A seeded one therefore drafts by a rule that depends on its own tokens
# only, never on timings or on other requests: K tokens each step (fewer near max_new_tokens
# or under its num_speculative_tokens), prompt lookup's copy where there is one, else the
# drafter's. The batched engine applies the same rule to a seeded row (``BatchEngine._row_k``).
SEEDED_RULE = "FixedK(K)"


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of an emitted token (``SamplingParams.logprobs``).

    ``logprob`` is under the same processing as plain decoding (``sampling.log_probs``);
    ``top`` holds the ``top_logprobs`` most likely ``(token id, logprob)`` at that position.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class StreamChunk:
    """What one decoding step added: new token ids and the text that is now final.

    The first ``from_draft`` of ``token_ids`` are accepted draft tokens; the rest (at most one)
    came from the target (the recovered or bonus token).

    The last chunk of a generation has ``finish_reason`` set ("length": ``max_new_tokens``
    reached; "stop": end-of-sequence token, stop token or stop string) and the final ``stats``.
    ``index`` says which of the ``n`` samples the chunk belongs to (they come one after the
    other); ``logprobs`` has one entry per token id when ``SamplingParams.logprobs`` is set.
    """

    token_ids: list[int]
    text: str
    from_draft: int = 0
    finish_reason: str | None = None
    stats: DecodeStats | None = None
    index: int = 0
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationOutput:
    """The result of ``SpeculativeDecoder.generate``.

    ``token_ids`` are the new tokens only (an end-of-sequence token included; with a stop
    string, up to the token that completed it); ``text`` is their decoded text, ending before
    a stop string ("" for models without a tokenizer).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: DecodeStats = field(default_factory=DecodeStats)
    logprobs: list[TokenLogprob] | None = None


def cut_at_stop(new: list[int], remaining: int, eos: frozenset[int]) -> tuple[list[int], str | None]:
    """A step's emitted tokens, stopped at the first end-of-sequence token or at
    ``max_new_tokens`` (``remaining``), mid-run if need be; and the finish reason, if any."""
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1], "stop"
    if len(new) >= remaining:
        return new[:remaining], "length"
    return new, None


def new_processor(target: LoadedModel, prompt_ids: Sequence[int], params: SamplingParams) -> LogitsProcessor:
    """A request's ``LogitsProcessor`` (raises on options it cannot apply: before any work)."""
    eos = sorted(target.eos_token_ids) + list(params.stop_token_ids)
    return LogitsProcessor(params, target.vocab_size, prompt_ids, target.tokenizer, eos, target.device)


def new_generator(params: SamplingParams, device: torch.device) -> torch.Generator:
    """A request's random generator: seeded by ``params.seed``, else by a fresh random seed. Its
    ``n`` samples share it: their draws follow each other, so they are independent (and a seed
    fixes all of them)."""
    seed = params.seed if params.seed is not None else random.randrange(2**63)
    return torch.Generator(device=device).manual_seed(seed)


def check_fits(context_length: int, prompt_len: int, max_new_tokens: int) -> None:
    """Raise ``ContextLengthError`` unless prompt + ``max_new_tokens`` fit the context window."""
    room = context_length - prompt_len
    if room <= 0:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens but the context window holds {context_length}: shorten the prompt"
        )
    if max_new_tokens > room:
        raise ContextLengthError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"context window ({context_length}): ask for at most {room} new tokens"
        )


@dataclass
class Row:
    """One sample being decoded, as both engines keep it between steps: its sequence (prompt and
    output), its processor and detokenizer, its stop tokens and statistics."""

    params: SamplingParams
    processor: LogitsProcessor
    detok: Detokenizer | None
    eos: frozenset[int]
    sequence: list[int]
    stats: DecodeStats

    @classmethod
    def start(cls, target: LoadedModel, prompt_ids: Sequence[int], params: SamplingParams,
              processor: LogitsProcessor, **more) -> Row:
        """A row at the start of a sample of ``prompt_ids`` (``more``: a subclass's fields)."""
        tokenizer = target.tokenizer
        eos = (frozenset() if params.ignore_eos else target.eos_token_ids) | frozenset(params.stop_token_ids)
        return cls(params=params, processor=processor,
                   detok=Detokenizer(tokenizer, params.stop) if tokenizer is not None else None, eos=eos,
                   sequence=list(prompt_ids), stats=DecodeStats(prompt_tokens=len(prompt_ids)), **more)

    @property
    def remaining(self) -> int:
        """Tokens it may still emit."""
        return self.params.max_new_tokens - self.stats.new_tokens

    def emit(self, tokens: list[int]) -> tuple[list[int], str, str | None]:
        """Commit a step's accepted drafts and recovered or bonus token: cut at the first stop
        token, stop string or ``max_new_tokens``; returns the tokens kept, the text now final
        and the finish reason (None: the sample goes on)."""
        new, finish_reason = cut_at_stop(tokens, self.remaining, self.eos)
        text = ""
        if self.detok is not None:
            text, keep = self.detok.add(new)
            if self.detok.stopped:
                new, finish_reason = new[:keep], "stop"
        self.sequence.extend(new)
        self.processor.commit(new)
        self.stats.new_tokens += len(new)
        if finish_reason is not None and self.detok is not None:
            text += self.detok.flush()
        return new, text, finish_reason


def token_logprobs(logits: torch.Tensor, new: list[int], params: SamplingParams) -> list[TokenLogprob]:
    """The log-probabilities of the emitted tokens ``new``: ``logits`` (``[len(new), V]``,
    processed) has the row that predicted each, in order."""
    logp = log_probs(logits, params)  # [len(new), V]
    chosen = logp[torch.arange(len(new)), torch.tensor(new)].tolist()  # host sync: reported
    if params.top_logprobs:
        top = torch.topk(logp, params.top_logprobs, dim=-1)
        tops = [tuple(zip(ids, values)) for ids, values in zip(top.indices.tolist(), top.values.tolist())]
    else:
        tops = [()] * len(new)
    return [TokenLogprob(token, value, top) for token, value, top in zip(new, chosen, tops)]


class SpeculativeDecoder:
    """Generates from ``target`` exactly as the target alone would, faster when drafts are good.

    Args:
        target: the model whose output distribution is kept.
        draft: what drafts (``quickdraft.drafters.registry.make_drafter``): a smaller
            ``LoadedModel`` (with another tokenizer, it drafts the tokens both vocabularies
            share: ``CrossTokenizerDrafter``), ``"ngram"`` (prompt lookup), ``"eagle:DIR"`` or
            ``"medusa:DIR"`` (an EAGLE or Medusa head trained for this target,
            docs/trained_drafters.md), any ``Drafter``, or ``None`` for plain target-only
            decoding (the reference path). A model with a vocabulary over 64k tokens drafts
            over its ``DEFAULT_DRAFT_VOCABULARY`` most frequent tokens, and a draft model sees
            the prompt's last ``DEFAULT_DRAFT_CONTEXT_WINDOW`` tokens; pass
            ``DraftModelDrafter(model)`` to draft over all tokens with the whole prompt.
        num_speculative_tokens: K, the most tokens drafted per step (>= 1).
        policy: chooses how many tokens (0..K) to draft each step. The default, ``AdaptiveK``,
            picks the count with the best expected tokens per second from the acceptance and
            costs it measures, down to 0 (plain decoding) when speculation does not pay;
            ``FixedK(K)`` always drafts K. The choice never changes the output distribution.
            The seed rule: a sampled generation with a ``seed`` drafts as ``FixedK(K)`` does
            whatever the policy (``SEEDED_RULE``), so that the seed gives the same text from
            ``generate``, ``stream`` and the server, alone or in a batch.
        tree: draft a tree of candidates each step instead of a chain (``quickdraft.tree``).
            K is then the tree's depth (``num_speculative_tokens`` is not used), and the
            policy's k caps the depth of each step's tree.
        prompt_lookup: before running a draft model or head, look the sequence's last n-gram
            up in the prompt and the text so far (``PromptLookupFirst``); on a match, draft
            the K tokens that followed it, for free, and skip the model this step. Default:
            on for a draft model and an EAGLE head, off for ``"ngram"`` (it is prompt lookup
            already) and custom drafters. The policy learns each source's acceptance apart
            and verifies only as much of a copy as pays on this machine.
        lookup: what drafts those copies (default ``PromptLookupDrafter``);
            ``SuffixDrafter(SuffixCacheStore(...))`` also copies from the decoder's earlier
            generations (``quickdraft.drafters.suffix_cache``).

    One decoder decodes one sequence at a time; it is not thread-safe.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: Spec = None,
        num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
        policy: SpeculationPolicy | None = None,
        tree: TreeSpec | None = None,
        prompt_lookup: bool | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise InvalidParameterError(
                f"num_speculative_tokens (K) must be an integer >= 1, got {num_speculative_tokens}"
            )
        self.target = target
        self.drafter = make_drafter(draft, target, tree, prompt_lookup, lookup)
        self.tree = tree
        self.num_speculative_tokens = num_speculative_tokens if tree is None else tree.max_depth
        self.policy = policy if policy is not None else AdaptiveK(self.num_speculative_tokens)
        # An EAGLE head drafts from the target's features: the target's runner keeps them.
        self._feeds_features = self.drafter is not None and self.drafter.needs_target_features
        self._runner = ModelRunner(target, keep_features=self._feeds_features)
        draft_context = None if self.drafter is None else self.drafter.footprint().context_length
        # The longest prompt + output the decoder takes: the target's window, or the draft's if shorter.
        self.context_length = min(target.context_length, draft_context or target.context_length)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt given as text (needs a tokenizer) or as ids."""
        if isinstance(prompt, str):
            if self.target.tokenizer is None:
                raise InvalidParameterError(
                    f"{self.target.name} has no tokenizer: pass the prompt as a list of token ids"
                )
            ids = self.target.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = [int(i) for i in prompt]
            vocab = self.target.vocab_size
            if any(not 0 <= i < vocab for i in ids):
                raise InvalidParameterError(f"prompt token ids must be in [0, {vocab})")
        if not ids:
            raise InvalidParameterError("the prompt is empty: give at least one token")
        return ids

    def release_caches(self) -> None:
        """Drop the target's KV cache of the last sequence (every generation starts from an empty
        one anyway), so that a long prompt's cache does not stay resident while the decoder is idle."""
        self._runner.reset()

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None
    ) -> GenerationOutput:
        """Generate a continuation of ``prompt`` (text or token ids); see ``stream``."""
        if params is not None and params.n > 1:
            raise InvalidParameterError("generate returns one sample: use generate_choices for n > 1")
        return self.generate_choices(prompt, params)[0]

    def generate_choices(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None
    ) -> list[GenerationOutput]:
        """``params.n`` independent continuations of ``prompt``, sharing its prefill; see ``stream``."""
        params = params or SamplingParams()
        token_ids: list[list[int]] = [[] for _ in range(params.n)]
        text: list[list[str]] = [[] for _ in range(params.n)]
        logprobs: list[list[TokenLogprob]] = [[] for _ in range(params.n)]
        outputs: list[GenerationOutput] = []
        for chunk in self.stream(prompt, params):
            token_ids[chunk.index].extend(chunk.token_ids)
            text[chunk.index].append(chunk.text)
            logprobs[chunk.index].extend(chunk.logprobs or [])
            if chunk.finish_reason is not None:
                assert chunk.stats is not None
                i = chunk.index
                outputs.append(GenerationOutput(
                    "".join(text[i]), token_ids[i], chunk.finish_reason, chunk.stats,
                    logprobs[i] if params.logprobs else None,
                ))
        return outputs

    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        prefill_chunk_tokens: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk]:
        """Generate step by step, yielding each step's tokens and newly final text.

        With ``params.n > 1`` the samples come one after the other (``StreamChunk.index``);
        they share the prompt's prefill in the target's cache and one random generator.

        Args:
            prefill_chunk_tokens: feed the prompt to the target this many tokens per forward
                (None: all in one). Chunks bound the prefill's activation memory, and they are
                where ``cancelled`` is checked.
            cancelled: polled before each prefill chunk; once it returns True the generator ends
                without a final chunk. A server uses it to stop the prefill of a long prompt
                whose client has left (between steps, the consumer simply stops iterating).

        Raises (before any work is done):
            ContextLengthError: prompt + ``max_new_tokens`` does not fit the context window.
            InvalidParameterError: stop strings or structured output without a tokenizer, bad
                prompt ids, logit bias or stop token ids outside the vocabulary, an output
                constraint that does not compile.
        """
        params = params or SamplingParams()
        prompt_ids = self.encode(prompt)
        first = self._prepare(prompt_ids, params)  # raises here, before any work, on bad options
        if prefill_chunk_tokens is not None and prefill_chunk_tokens < 1:
            raise InvalidParameterError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        return self._decode_samples(prompt_ids, params, first, prefill_chunk_tokens, cancelled)

    def check(self, prompt: str | Sequence[int], params: SamplingParams) -> None:
        """Raise what ``stream`` would raise for this request, without generating (a server
        checks a request before queueing it). Safe to call while another thread decodes."""
        self._prepare(self.encode(prompt), params)

    def _prepare(self, prompt_ids: list[int], params: SamplingParams) -> LogitsProcessor:
        check_fits(self.context_length, len(prompt_ids), params.max_new_tokens)
        if params.stop and self.target.tokenizer is None:
            raise InvalidParameterError("stop strings need a model with a tokenizer")
        return new_processor(self.target, prompt_ids, params)

    def _decode_samples(
        self, prompt_ids: list[int], params: SamplingParams, first: LogitsProcessor,
        prefill_chunk_tokens: int | None = None, cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk]:
        generator = new_generator(params, self.target.device)
        for index in range(params.n):
            processor = first if index == 0 else new_processor(self.target, prompt_ids, params)
            row = Row.start(self.target, prompt_ids, params, processor)
            # The target's runner counts from the request's start: each sample reports its own.
            before = (self._runner.forwards, self._runner.positions) if index else (0, 0)
            for chunk in self._decode(row, generator, index == 0, prefill_chunk_tokens, cancelled):
                chunk.index = index
                if chunk.stats is not None:
                    chunk.stats.target_forwards -= before[0]
                    chunk.stats.target_positions -= before[1]
                yield chunk

    def _decode(
        self,
        row: Row,
        generator: torch.Generator,
        prefill: bool = True,
        prefill_chunk_tokens: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk]:
        params, processor, stats, sequence = row.params, row.processor, row.stats, row.sequence
        prompt_ids = sequence[:]
        # The seed rule (``SEEDED_RULE``); greedy output never depends on the policy.
        seeded_sampling = params.seed is not None and not params.greedy
        policy = FixedK(self.num_speculative_tokens) if seeded_sampling else self.policy
        policy.begin()

        # Prefill: the target's cache takes the prompt but its last token, which every step feeds
        # (with the drafts behind it) so the first token comes out of the normal loop. The
        # n samples of a prompt share the target's: its cache still holds the prompt, and the
        # first step's forward crops the previous sample away. A draft model reads the prompt
        # when it first drafts (``Drafter.behind``), if drafting pays for it.
        clock = time.perf_counter()
        if prefill:
            self._runner.reset()
            if not self._prefill(prompt_ids[:-1], prefill_chunk_tokens, cancelled):
                return
        if self.drafter is not None:
            self.drafter.begin(prompt_ids)
        now = time.perf_counter()
        stats.time_prefill, clock = now - clock, now

        while True:
            remaining = row.remaining
            # Never draft past max_new_tokens: a step emits up to k + 1 tokens.
            cap = min(params.speculative_tokens(self.num_speculative_tokens), remaining - 1)

            # Draft: the policy weighs a free copy (the grammar's forced tokens, then prompt lookup
            # in front of the drafter) against the drafter's k tokens (after the forced ones, and
            # what it must read first) and against plain decoding (k = 0).
            forced, free = self._free_draft(sequence, cap, processor, alone=not seeded_sampling)
            lag = self.drafter.behind(sequence) if self.drafter is not None and cap > 0 else 0
            choice = policy.choose(cap, len(free), lag, remaining)
            from_lookup = choice.source == LOOKUP
            # A head drafts from the target's features, which end with the sequence: it cannot
            # draft after tokens the target has not read, so the forced tokens go in the copy only.
            forced = forced[: choice.k] if from_lookup or not self._feeds_features else []
            if from_lookup:
                draft = Draft(tokens=free.tokens[: choice.k])
            else:
                if lag and choice.k > len(forced):
                    self.drafter.catch_up(sequence)
                    now = time.perf_counter()
                    policy.observe_catch_up(lag, now - clock)
                    stats.time_draft, clock = stats.time_draft + now - clock, now
                draft = self._draft(sequence, choice.k, params, generator, processor, forced)
            now = time.perf_counter()
            draft_seconds, clock = now - clock, now

            # Verify: one target forward over [last token, drafts...] (or the tree's nodes).
            logits = self._score(sequence, draft, processor)  # [len(draft) + 1, V]
            # Accept: the pure rule (verify.py / verify_tree.py) decides what is kept.
            result = self._accept(draft, logits, params, generator)
            # Commit: the target's cache keeps the accepted drafts, the rejected ones roll back.
            self._commit(sequence, draft, result)
            now = time.perf_counter()
            verify_seconds, clock = now - clock, now

            stats.time_draft += draft_seconds
            stats.time_verify += verify_seconds
            # A tree drafts one position per depth: its acceptance counts by depth.
            stats.record_step(draft.depth, result.num_accepted, from_lookup, len(forced))
            policy.observe(choice.source, draft.depth, result.num_accepted, draft_seconds, verify_seconds)
            # Tensor -> list, once a step: the sequence, the stop checks, the detokenizer and the
            # processor's counts work on host ints, and the caller gets ints.
            path = range(result.num_accepted) if draft.parents is None else result.path
            new, text, finish_reason = row.emit(draft.tokens[list(path)].tolist() + [result.next_token])
            logprobs = self._logprobs(logits, draft, result, new, params) if params.logprobs else None
            now = time.perf_counter()
            stats.time_other, clock = stats.time_other + now - clock, now
            from_draft = min(result.num_accepted, len(new))
            if finish_reason is not None:
                self._count_forwards(stats)
                yield StreamChunk(new, text, from_draft, finish_reason, stats, logprobs=logprobs)
                return
            yield StreamChunk(new, text, from_draft, logprobs=logprobs)
            # Time the consumer spends between steps is not ours to count.
            clock = time.perf_counter()

    def _prefill(
        self, token_ids: list[int], chunk_tokens: int | None, cancelled: Callable[[], bool] | None
    ) -> bool:
        """Feed ``token_ids`` to the target's cache, ``chunk_tokens`` per forward; False when
        ``cancelled`` stopped it."""
        chunk = chunk_tokens or max(1, len(token_ids))
        for start in range(0, len(token_ids), chunk):
            if cancelled is not None and cancelled():
                return False
            self._runner.forward(token_ids[start:start + chunk])
        return True

    def _free_draft(self, sequence: list[int], k: int, processor: LogitsProcessor,
                    alone: bool) -> tuple[list[int], Draft]:
        """The grammar's forced tokens (at most k), and the free copy on offer: those, then prompt
        lookup's copy in front of the drafter (``drafters.forced.free_copy``; ``alone``: the
        forced tokens are a copy by themselves), on the target's device; neither for plain
        decoding."""
        if self.drafter is None or k < 1:
            return [], Draft(tokens=torch.empty(0, dtype=torch.long, device=self.target.device))
        # Host sync: the lookup and the grammar work on token lists.
        forced, copy = free_copy(processor, sequence, k, lambda ahead, n: self.drafter.free_draft(ahead, n).tokens.tolist(),
                                 alone)
        return forced, Draft(tokens=torch.tensor(copy, dtype=torch.long, device=self.target.device))

    def _draft(
        self, sequence: list[int], k: int, params: SamplingParams, generator: torch.Generator,
        processor: LogitsProcessor, forced: list[int],
    ) -> Draft:
        """k tokens: ``forced`` (the grammar's, at most k), then the drafter's, drafted after them."""
        device = self.target.device
        if self.drafter is None or k < 1:  # plain decoding: verify the last token alone
            return Draft(tokens=torch.empty(0, dtype=torch.long, device=device))
        if k > len(forced):
            if self._feeds_features:
                # The target has seen every token of the sequence but the last (the last commit
                # kept exactly the accepted ones); the last is fed with this step's drafts.
                self.drafter.observe_target(self._runner.features(len(sequence) - 1))
            draft = self.drafter.propose(sequence + forced, k - len(forced), params, generator, processor.after(forced))
        else:
            draft = Draft(tokens=torch.empty(0, dtype=torch.long))
        draft = after_forced(forced, draft)
        return Draft(
            tokens=draft.tokens.to(device),
            probs=None if draft.probs is None else draft.probs.to(device),
            parents=None if draft.parents is None else draft.parents.to(device),
        )

    def _score(self, sequence: list[int], draft: Draft, processor: LogitsProcessor) -> torch.Tensor:
        """The target's processed logits for a draft, from one forward: ``[K + 1, V]`` for a
        chain (row i after ``sequence + drafts[:i]``), ``[N + 1, V]`` for a tree (row 0 after the
        sequence, row i + 1 after node i's root-to-node path, ``quickdraft.tree``); each row is
        processed as plain decoding would have after emitting the tokens before it."""
        # Host sync: the runner and the processor take token lists.
        tokens = draft.tokens.tolist()
        if draft.parents is None:
            return processor(self._runner.forward_tail(sequence + tokens, num_logits=len(tokens) + 1), tokens)
        parents = draft.parents.tolist()
        return processor(self._runner.forward_tree(sequence, tokens, parents, num_logits=len(tokens) + 1),
                         tokens, parents)

    @staticmethod
    def _accept(
        draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> StepResult | TreeStepResult:
        """The acceptance rule for a chain or a tree, greedy or sampled."""
        if params.greedy:
            if draft.parents is None:
                return verify_greedy(draft.tokens, logits)
            return verify_tree_greedy(draft.tokens, draft.parents, logits)
        probs = logits_to_probs(logits, params)
        if draft.parents is None:
            return verify_sampled(draft.tokens, draft.probs, probs, generator)
        return verify_tree_sampled(draft.tokens, draft.parents, draft.probs, probs, generator)

    def _commit(self, sequence: list[int], draft: Draft, result: StepResult | TreeStepResult) -> None:
        """Keep the sequence and the accepted drafts in the target's cache; roll the rest back.

        A chain's accepted drafts are already in place: the cache is cut after them. A tree's
        accepted path moves into place and the other nodes go. The recovered or bonus token is
        not cached: the next step feeds it with its drafts.
        """
        if draft.parents is None:
            self._runner.truncate(len(sequence) + result.num_accepted)
        else:
            self._runner.keep_tree_path(result.path)

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, draft: Draft, result: StepResult | TreeStepResult, new: list[int],
        params: SamplingParams,
    ) -> list[TokenLogprob]:
        """The target's log-probabilities of the emitted tokens ``new``, from verification's rows.

        ``logits`` are the processed rows verification used: a chain's row i predicts the
        (i+1)-th emitted token; a tree's emitted tokens follow rows 0, then node + 1 for each
        accepted node. ``new`` may be cut short (a stop), so only its rows are used.
        """
        if draft.parents is None:
            rows = list(range(len(new)))
        else:
            rows = [0] + [node + 1 for node in result.path]
        return token_logprobs(logits[rows[: len(new)]], new, params)

    def _count_forwards(self, stats: DecodeStats) -> None:
        stats.target_forwards = self._runner.forwards
        stats.target_positions = self._runner.positions
        if self.drafter is not None:
            stats.draft_forwards = self.drafter.forwards
            stats.draft_positions = self.drafter.positions

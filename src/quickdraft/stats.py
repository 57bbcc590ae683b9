"""What one generation did and how long it took.

Conventions:

* A **step** is one target verification forward (draft K tokens, verify K + 1 positions). Plain
  decoding is speculation with K = 0: every step emits one token.
* ``accepted_tokens`` counts accepted **draft** tokens only. Each step also emits one token
  from the target (recovered or bonus), so
  ``mean_tokens_per_step = (accepted_tokens + steps) / steps``: **it counts the bonus/recovered
  token**, equals 1.0 for plain decoding and ``1 + K`` when every draft is accepted.
* With a tree draft, ``drafted_tokens`` and ``drafted_by_position`` count the tree's **depth**
  (one drafted position per depth, however many siblings it holds) and ``accepted_tokens`` the
  length of the accepted path, so acceptance compares chains and trees position by position;
  ``draft_positions`` counts every node the draft model processed.
* Forward counts and positions include the prefill. ``target_positions`` is the number of token
  positions the target processed: prompt length - 1 (prefill) + one per verified position, so
  ``target_positions - (prompt_tokens - 1) - new_tokens`` is the number of rejected (wasted)
  draft positions, and is 0 when every draft is accepted: nothing is recomputed.
* With prompt lookup in front of a draft model (the default), ``lookup_steps`` of the steps
  drafted a copy from the context instead of running the model, and ``lookup_accepted_tokens`` of
  the accepted tokens came from them; the other counters include both kinds of step.
* With structured output, ``grammar_tokens`` of the drafted tokens were the ones the grammar
  forces (``quickdraft.drafters.forced``: first in a step's draft, whichever source drafted
  the rest), and ``grammar_accepted_tokens`` of the accepted ones; the other counters include them.
* Times are wall-clock seconds. ``tokens_per_second`` is new tokens over the whole generation,
  prefill included (what a user waits for).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    """Counters and timings of one ``generate`` call; see the module docstring for conventions."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    lookup_steps: int = 0
    lookup_accepted_tokens: int = 0
    grammar_tokens: int = 0
    grammar_accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    target_forwards: int = 0
    target_positions: int = 0
    draft_forwards: int = 0
    draft_positions: int = 0
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_draft + self.time_verify + self.time_other

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Entry i: of the steps that drafted a token at position i, the share accepted there.

        Acceptance stops at the first rejection, so entry i is conditional on positions < i
        having been accepted.
        """
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def mean_tokens_per_step(self) -> float:
        """Tokens emitted per target forward, counting the recovered/bonus token (>= 1)."""
        return (self.accepted_tokens + self.steps) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def record_step(self, drafted: int, accepted: int, from_lookup: bool = False, forced: int = 0) -> None:
        """Count one verification step that drafted ``drafted`` tokens and accepted ``accepted``.

        ``from_lookup``: the drafts came from the prompt-lookup stage in front of a model drafter.
        ``forced``: the first ``forced`` drafts were the grammar's forced tokens.
        """
        self.steps += 1
        self.grammar_tokens += forced
        self.grammar_accepted_tokens += min(accepted, forced)
        if from_lookup:
            self.lookup_steps += 1
            self.lookup_accepted_tokens += accepted
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        while len(self.drafted_by_position) < drafted:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def to_dict(self) -> dict:
        """Every counter plus the derived figures, JSON-ready."""
        data = asdict(self)
        data.update(
            time_total=self.time_total,
            acceptance_rate=self.acceptance_rate,
            acceptance_by_position=self.acceptance_by_position,
            mean_tokens_per_step=self.mean_tokens_per_step,
            tokens_per_second=self.tokens_per_second,
        )
        return data

    def summary(self) -> str:
        """One line for a terminal."""
        line = (
            f"{self.new_tokens} new tokens in {self.time_total:.2f} s "
            f"({self.tokens_per_second:.2f} tok/s), {self.target_forwards} target forwards"
        )
        if self.drafted_tokens:
            line += (
                f", {self.mean_tokens_per_step:.2f} tokens per target forward, "
                f"acceptance {self.acceptance_rate:.1%}"
            )
        if self.lookup_steps:
            line += f", {self.lookup_steps} of {self.steps} steps drafted by prompt lookup"
        if self.grammar_tokens:
            line += f", {self.grammar_accepted_tokens} of {self.grammar_tokens} forced tokens accepted"
        return line

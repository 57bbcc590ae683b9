"""The sampling options that depend on the text so far, applied in one place to p and q alike.

For every row of logits the engine or a drafter scores, ``LogitsProcessor`` applies, in this
order (the order of vLLM's sampler; plain decoding is the same code with no drafts):

1. ``logit_bias``: added to the logits;
2. ``repetition_penalty`` (transformers / vLLM): a token seen in the prompt or the output so
   far has its logit divided by the penalty if positive, multiplied by it if negative;
3. ``frequency_penalty`` and ``presence_penalty`` (OpenAI): minus ``frequency * count +
   presence * (count > 0)``, counting the output so far (not the prompt, as vLLM);
4. the structured-output constraint (``quickdraft.structured``): forbidden tokens get -inf.

Temperature, top-k, top-p and min-p follow in ``sampling.logits_to_probs``; greedy decoding
takes the argmax of the processed logits.

"So far" is per row: the row that predicts the token after drafted tokens ``x_1..x_i`` counts
them as if they had been emitted, exactly as plain decoding would have after emitting them.
That is what keeps speculation lossless under these options: the target's p at every verified
position is plain decoding's p after that position's prefix. Rows are given as nodes of the
draft (a chain is a tree whose node ``i`` has parent ``i - 1``); the prefix of a row is its
node's root-to-node path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.errors import InvalidParameterError
from quickdraft.structured import Constraint, grammar_of


def node_paths(parents: Sequence[int], rows: Sequence[int]) -> list[list[int]]:
    """The nodes from the root down to each row's node (inclusive); -1 (the root) gives [].

    Example: parents ``[-1, 0, 0, 1]``, rows ``[-1, 3, 2]`` -> ``[[], [0, 1, 3], [0, 2]]``.
    """
    paths = []
    for node in rows:
        path = []
        while node != -1:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return paths


class LogitsProcessor:
    """The options of one generation that depend on its prefix, and the state they need.

    Args:
        params: the request's sampling parameters.
        vocab_size: the width of the logits.
        prompt_ids: the prompt (the repetition penalty counts it).
        tokenizer: the target's tokenizer (for a structured-output constraint; else unused).
        eos_token_ids: the tokens that end the output (where a constraint allows them).

    Raises:
        InvalidParameterError: a ``logit_bias`` or stop token id outside the vocabulary, or an
            output constraint that does not compile or has no tokenizer to work with.
    """

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        prompt_ids: Sequence[int],
        tokenizer=None,
        eos_token_ids: Sequence[int] = (),
        device: torch.device | str = "cpu",
    ) -> None:
        self.params = params
        for token in [t for t, _ in params.logit_bias] + list(params.stop_token_ids):
            if not 0 <= token < vocab_size:
                raise InvalidParameterError(f"token id {token} (logit_bias or stop_token_ids) is not in [0, {vocab_size})")
        self._bias: torch.Tensor | None = None  # [V]
        if params.logit_bias:
            self._bias = torch.zeros(vocab_size, device=device)
            ids, values = zip(*params.logit_bias)
            self._bias[list(ids)] = torch.tensor(values, device=device)
        self._penalised = (
            params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        )
        self._output_counts = torch.zeros(vocab_size, device=device)  # [V] occurrences in the output
        self._in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # [V]
        self._in_prompt[list(prompt_ids)] = True
        self._constraint: Constraint | None = None
        grammar = grammar_of(params)
        if grammar is not None:
            if tokenizer is None:
                raise InvalidParameterError("structured output needs a model with a tokenizer")
            self._constraint = Constraint(grammar, tokenizer, vocab_size, eos_token_ids)
        self.active = self._bias is not None or self._penalised or self._constraint is not None

    def commit(self, tokens: Sequence[int]) -> None:
        """Count emitted tokens as output (and advance the constraint past them)."""
        if not self.active or not tokens:
            return
        ids = torch.tensor(tokens, device=self._output_counts.device)
        self._output_counts.index_add_(0, ids, torch.ones(len(tokens), device=ids.device))
        if self._constraint is not None:
            self._constraint.commit(tokens)

    def forced_tokens(self, limit: int, path: Sequence[int] = ()) -> list[int]:
        """The tokens the output constraint forces after the committed output and ``path``, at
        most ``limit`` (``Constraint.forced``); [] without a constraint."""
        return [] if self._constraint is None else self._constraint.forced(limit, path)

    def after(self, prefix: Sequence[int]) -> LogitsProcessor | AfterPrefix:
        """This processor for a drafter that drafts after ``prefix`` (tokens drafted before it
        this step): its rows are processed as the rows after ``prefix`` + their own path."""
        return AfterPrefix(self, prefix) if prefix else self

    def __call__(
        self,
        logits: torch.Tensor,
        tokens: Sequence[int] = (),
        parents: Sequence[int] | None = None,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Process logits whose rows predict the token after drafted prefixes.

        Args:
            logits: ``[R, V]`` raw logits.
            tokens: ``[N]`` drafted tokens (ids); a chain when ``parents`` is None.
            parents: ``[N]`` a tree's parents (``quickdraft.tree``), or None for a chain.
            rows: ``[R]`` the node whose path each row follows (-1: the committed sequence
                alone). Default: ``-1, 0, ..., R - 2`` (a chain: row i after ``tokens[:i]``,
                or a tree: row 0 after the root and row ``i + 1`` after node ``i``).

        Returns:
            ``[R, V]`` float32 processed logits; ``logits`` itself when no option is active.
        """
        if not self.active:
            return logits
        num_rows = logits.shape[0]
        tokens = [int(t) for t in tokens]
        if parents is None:
            parents = list(range(-1, len(tokens) - 1))
        if rows is None:
            rows = list(range(-1, num_rows - 1))
        assert len(rows) == num_rows, (len(rows), num_rows)
        paths = [[tokens[node] for node in path] for path in node_paths(parents, rows)]
        out = logits.float().clone()  # [R, V]
        if self._bias is not None:
            out += self._bias
        if self._penalised:
            out = self._penalise(out, paths)
        if self._constraint is not None:
            self._constraint.apply(out, paths)
        return out

    def _penalise(self, logits: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """Repetition, frequency and presence penalties, each row counting its own path."""
        # [R, V] occurrences in the output: what is committed plus the row's drafted prefix.
        counts = self._output_counts.repeat(len(paths), 1)
        row_ids = [r for r, path in enumerate(paths) for _ in path]
        if row_ids:
            token_ids = [t for path in paths for t in path]
            counts.index_put_(
                (torch.tensor(row_ids, device=counts.device), torch.tensor(token_ids, device=counts.device)),
                torch.ones(len(row_ids), device=counts.device),
                accumulate=True,
            )
        params = self.params
        if params.repetition_penalty != 1.0:
            seen = self._in_prompt | (counts > 0)  # [R, V]
            penalised = torch.where(
                logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty
            )
            logits = torch.where(seen, penalised, logits)
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
        return logits


class AfterPrefix:
    """A ``LogitsProcessor`` seen from after ``prefix``: the rows a drafter scores after the
    grammar's forced tokens (``quickdraft.drafters.forced``) are processed as plain decoding
    would after ``prefix`` and the row's own drafted path. Called as the processor is.

    Example: prefix ``[7, 8]``, a chain ``tokens=[5]`` with ``rows=[0]`` (after token 5) is
    the processor's ``tokens=[7, 8, 5]``, ``parents=[-1, 0, 1]``, ``rows=[2]``.
    """

    def __init__(self, processor: LogitsProcessor, prefix: Sequence[int]) -> None:
        self.processor = processor
        self.prefix = [int(t) for t in prefix]

    def __call__(
        self,
        logits: torch.Tensor,
        tokens: Sequence[int] = (),
        parents: Sequence[int] | None = None,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        n = len(self.prefix)
        tokens = [int(t) for t in tokens]
        if parents is None:
            parents = list(range(-1, len(tokens) - 1))
        if rows is None:
            rows = list(range(-1, logits.shape[0] - 1))
        # The prefix is a chain from the root; the drafter's roots hang from its last node.
        shifted = list(range(-1, n - 1)) + [p + n if p >= 0 else n - 1 for p in parents]
        return self.processor(logits, self.prefix + tokens, shifted, [r + n for r in rows])

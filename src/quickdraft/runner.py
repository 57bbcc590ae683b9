"""One model decoding one sequence, with a KV cache that knows which tokens it holds.

The cache is a transformers ``DynamicCache``; rolling back is cropping it to a length. The
runner keeps the token ids whose keys and values are cached, so a caller can hand it the
full sequence and the runner feeds only what the cache lacks (``forward_tail``): the prompt
is encoded once and no kept token is recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from quickdraft.errors import UnsupportedModelError
from quickdraft.models.base import LoadedModel


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    # Fast path: during decoding the cache is a prefix of the sequence, or differs only in
    # its last few (rejected) tokens, so comparing whole slices first is usually enough.
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


class ModelRunner:
    """Forward passes of one model over one growing sequence (batch size 1).

    Attributes:
        model: the loaded model.
        cached_ids: token ids whose keys/values are in the cache, in order.
        forwards: number of forward passes run since the last ``reset``.
        positions: number of token positions processed since the last ``reset``.
    """

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.cached_ids: list[int] = []
        self.forwards = 0
        self.positions = 0
        self._cache = self._new_cache()
        self._rows: torch.Tensor | None = None  # [R] vocabulary rows the output layer computes
        self._row_weight: torch.Tensor | None = None  # [R, H] those rows of the output layer

    def restrict_vocabulary(self, rows: torch.Tensor | None) -> None:
        """Compute logits for these token ids only; every other logit is -inf.

        The output layer of a small model over a 150k vocabulary is a quarter of its cost;
        computing only the tokens a draft is likely to propose saves most of that (FR-Spec,
        arXiv:2502.14856). Sampling from the restricted logits is still sampling from a
        distribution, so the rejection rule stays exact. ``None`` restores the full layer.
        """
        if rows is None:
            self._rows = self._row_weight = None
            return
        head = self.model.module.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("restrict_vocabulary supports output layers without a bias")
        self._rows = rows.to(self.model.device)
        self._row_weight = head.weight.index_select(0, self._rows).contiguous()

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.module.config)
        # Sliding-window layers drop old states once the window is full; recording keeps them
        # until the next crop, so a rollback past rejected drafts can restore the window.
        cache.activate_past_recording()
        if not cache.is_croppable:
            raise UnsupportedModelError(
                f"{self.model.name}: its cache cannot be rolled back (recurrent or sliding-window "
                "state), so rejected draft tokens could not be undone; use a transformer model "
                "with a full-attention KV cache"
            )
        return cache

    def reset(self) -> None:
        """Forget the sequence: empty cache, zero counters."""
        self._cache = self._new_cache()
        self.cached_ids = []
        self.forwards = 0
        self.positions = 0

    def truncate(self, length: int) -> None:
        """Roll the cache back so that it holds the first ``length`` cached tokens."""
        remove = len(self.cached_ids) - length
        if remove < 0:
            raise ValueError(f"cannot truncate a cache of {len(self.cached_ids)} tokens to {length}")
        # Always crop, even by 0: that is when sliding-window layers trim back to the window.
        self._cache.crop(-remove)  # transformers: a negative count removes that many
        del self.cached_ids[length:]

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Append ``token_ids`` to the cache and return the logits of the last positions.

        Args:
            token_ids: ``[T]`` new tokens, T >= 1, continuing ``cached_ids``.
            num_logits: how many trailing positions to return logits for (1 <= n <= T); the
                model's output layer then runs on those rows only.

        Returns:
            ``[num_logits, V]`` logits in the model's dtype; row i predicts the token after
            ``token_ids[T - num_logits + i]``.
        """
        t = len(token_ids)
        assert 1 <= num_logits <= t, (num_logits, t)
        start = len(self.cached_ids)
        device = self.model.device
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)  # [1, T]
        positions = torch.arange(start, start + t, device=device)  # [T]
        inputs = dict(input_ids=input_ids, cache=self._cache, use_cache=True, position_ids=positions.unsqueeze(0))
        if self._rows is None:
            logits = self.model.module(**inputs, logits_to_keep=num_logits).logits[0, -num_logits:]
        else:
            hidden = self.model.module.get_decoder()(**inputs).last_hidden_state[0, -num_logits:]  # [n, H]
            logits = hidden.new_full((num_logits, self.model.vocab_size), float("-inf"))
            logits[:, self._rows] = hidden @ self._row_weight.T  # [n, R]
        self.cached_ids.extend(int(i) for i in token_ids)
        self.forwards += 1
        self.positions += t
        return logits  # [num_logits, V]

    def forward_tail(self, sequence: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Bring the cache up to ``sequence`` and return the logits of its last positions.

        Rolls back any cached tokens that ``sequence`` does not share (rejected drafts), then
        feeds the rest in one forward. At least ``num_logits`` tokens are fed, so the cache
        is cut back further if it already holds nearly all of ``sequence``.

        Returns:
            ``[num_logits, V]`` logits; the last row predicts the token after ``sequence``.
        """
        keep = min(_common_prefix_length(self.cached_ids, sequence), len(sequence) - num_logits)
        self.truncate(keep)
        return self.forward(sequence[keep:], num_logits)

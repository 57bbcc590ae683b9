"""One model decoding one sequence, with a KV cache that knows which tokens it holds.

The cache is a transformers ``DynamicCache``; rolling back is cropping it to a length. The
runner keeps the token ids whose keys and values are cached, so a caller can hand it the
full sequence and the runner feeds only what the cache lacks (``forward_tail``): the prompt
is encoded once and no kept token is recomputed.

With ``keep_features`` the runner also keeps the model's last-layer hidden state of every
cached position (what an EAGLE head drafts from), aligned with ``cached_ids``: rolled back
with the cache and, for trees, moved along the accepted path like the keys and values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from quickdraft.errors import UnsupportedModelError
from quickdraft.models.base import LoadedModel
from quickdraft.models.packing import native_bfloat16, pack_weight, packed_linear
from quickdraft.tree import additive_mask, follow, forward_layout

# ``cached_ids`` entry of a tree node not (yet) kept: it matches no token, so ``forward_tail``
# rolls pending nodes back like any rejected draft.
TREE_NODE = -1


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
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


class OutputRows:
    """Some rows of a draft's output layer: logits for those token ids only, -inf for every other.

    On a CPU with bfloat16 kernels the rows are held in bfloat16, packed (``models.packing``):
    half the bytes of float32 and no reorder per call, which takes a float32 int8 draft's step
    from 37 to 30 ms on the demo pair. The logits are then rounded as bfloat16 computes them;
    that is the draft's distribution, and the rejection rule is exact for whatever q it is.
    Elsewhere they are held and computed in float32, whatever the layer's dtype (an int8 draft's
    is bfloat16): without bfloat16 kernels, six rows of the demo draft's 33k-row layer took
    17 ms in bfloat16 and 9 ms in float32 (AVX2).

    Args:
        weight: ``[V, H]`` the output layer's weight.
        rows: ``[R]`` the token ids to compute.
        vocab_size: width of the logits returned (V).
    """

    def __init__(self, weight: torch.Tensor, rows: torch.Tensor, vocab_size: int) -> None:
        self.rows = rows.to(weight.device)
        self.packed = native_bfloat16(weight.device)
        self.vocab_size = vocab_size
        self._layer: torch.Tensor | None = weight
        self._weight: torch.Tensor | None = None

    @property
    def weight(self) -> torch.Tensor:
        """``[R, H]`` the selected rows, copied (and packed) when first used: a prompt whose draft
        never drafts (the policy decodes plainly) never pays the copy, 35-50 ms for the demo
        draft's 32k rows on an AMX CPU."""
        if self._weight is None:
            assert self._layer is not None
            selected = self._layer.index_select(0, self.rows)  # [R, H]
            self._weight = pack_weight(selected.to(torch.bfloat16)) if self.packed else selected.float()
            self._layer = None
        return self._weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` logits of ``hidden`` (``[n, H]``), in ``hidden``'s dtype."""
        logits = hidden.new_full((hidden.shape[0], self.vocab_size), float("-inf"))
        if self.packed:
            logits[:, self.rows] = packed_linear(hidden.to(torch.bfloat16), self.weight).to(hidden.dtype)  # [n, R]
        else:
            logits[:, self.rows] = self.product(hidden, self.weight)  # [n, R]
        return logits

    def product(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``[n, E]`` logits of ``hidden`` (``[n, H]``) for other rows ``weight`` (``[E, H]``) of
        the same layer, rounded as ``logits`` rounds."""
        dtype = torch.bfloat16 if self.packed else torch.float32
        return (hidden.to(dtype) @ weight.to(dtype).T).to(hidden.dtype)


class ModelRunner:
    """Forward passes of one model over one growing sequence (batch size 1).

    Attributes:
        model: the loaded model.
        cached_ids: token ids whose keys/values are in the cache, in order.
        forwards: number of forward passes run since the last ``reset``.
        positions: number of token positions processed since the last ``reset``.
        keep_features: whether ``features`` is available (the forwards then run the decoder and
            the output layer as two calls, which is the same arithmetic as one).
    """

    def __init__(self, model: LoadedModel, keep_features: bool = False) -> None:
        self.model = model
        self.keep_features = keep_features
        self.cached_ids: list[int] = []
        self.forwards = 0
        self.positions = 0
        self._cache = self._new_cache()
        self._tree_tokens: list[int] = []  # tokens and parents of the last tree fed
        self._tree_parents: list[int] = []
        self._rows: OutputRows | None = None  # the output layer's rows computed, None: all
        # [capacity, H] last-layer hidden state of each cached position; rows past
        # len(cached_ids) are stale. Grown by doubling so that a step does not copy the sequence.
        self._features: torch.Tensor | None = None

    def restrict_vocabulary(self, rows: torch.Tensor | None) -> None:
        """Compute logits for these token ids only; every other logit is -inf.

        The output layer of a small model over a 150k vocabulary is a quarter of its cost;
        computing only the tokens a draft is likely to propose saves most of that (FR-Spec,
        arXiv:2502.14856). Sampling from the restricted logits is still sampling from a
        distribution, so the rejection rule stays exact. ``None`` restores the full layer.
        """
        if rows is None:
            self._rows = None
            return
        head = self.model.module.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("restrict_vocabulary supports output layers without a bias")
        self._rows = OutputRows(head.weight, rows, self.model.vocab_size)

    def _logits(self, inputs: dict, num_logits: int, start: int) -> torch.Tensor:
        """Run the model on ``inputs`` fed at position ``start``; ``[num_logits, V]`` logits of the
        last positions.

        With a restricted vocabulary only those rows of the output layer are computed and every
        other logit is -inf. With ``keep_features`` the fed positions' hidden states are kept.
        """
        lean = self.model.lean
        if lean is None and self._rows is None and not self.keep_features:
            return self.model.module(**inputs, logits_to_keep=num_logits).logits[0, -num_logits:]
        if lean is not None:
            hidden = lean(inputs["input_ids"], self._cache, inputs["position_ids"], inputs.get("attention_mask"))[0]
        else:
            hidden = self.model.module.get_decoder()(**inputs).last_hidden_state[0]  # [T, H]
        if self.keep_features:
            self._store_features(start, hidden)
        hidden = hidden[-num_logits:]  # [n, H]
        if self._rows is None:
            return self.model.module.get_output_embeddings()(hidden)  # [n, V]
        return self._rows.logits(hidden)  # [n, V]

    def _store_features(self, start: int, hidden: torch.Tensor) -> None:
        """Write ``hidden`` (``[T, H]``) as the features of positions ``start .. start + T - 1``."""
        end = start + hidden.shape[0]
        if self._features is None or self._features.shape[0] < end:
            grown = hidden.new_empty((max(end, 2 * start, 64), hidden.shape[1]))
            if self._features is not None:
                grown[:start] = self._features[:start]
            self._features = grown
        self._features[start:end] = hidden

    def features(self, length: int) -> torch.Tensor:
        """``[length, H]`` last-layer hidden states (after the final norm: what the output layer
        reads) of the first ``length`` cached tokens; a view, valid until the next forward."""
        assert self.keep_features, "construct the runner with keep_features=True"
        assert 0 <= length <= len(self.cached_ids), (length, len(self.cached_ids))
        if length == 0:
            hidden_size = self.model.module.get_output_embeddings().weight.shape[1]
            return torch.empty((0, hidden_size), dtype=self.model.dtype, device=self.model.device)
        return self._features[:length]

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
        if not self.cached_ids:
            return  # a fresh cache has no layers to crop yet (a draft that has not read its prompt)
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
        logits = self._logits(inputs, num_logits, start)
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
        keep = min(common_prefix_length(self.cached_ids, sequence), len(sequence) - num_logits)
        self.truncate(keep)
        return self.forward(sequence[keep:], num_logits)

    # ---- trees (see quickdraft.tree) ------------------------------------------------------
    #
    # A tree forward leaves its nodes in the cache after the sequence, marked TREE_NODE in
    # ``cached_ids`` (their tokens are in ``_tree_tokens``), until ``keep_tree_path`` turns one
    # root-to-node path into ordinary cached tokens and drops the rest.

    def _pending_tree_nodes(self) -> int:
        """How many tree nodes the cache holds after the sequence (the trailing TREE_NODE run)."""
        n = 0
        while n < len(self.cached_ids) and self.cached_ids[-1 - n] == TREE_NODE:
            n += 1
        return n

    def _check_tree_support(self) -> None:
        attention = self.model.module.config._attn_implementation
        if attention not in ("sdpa", "eager"):
            raise UnsupportedModelError(
                f"{self.model.name}: tree speculation passes a 4-D attention mask, which {attention} "
                "attention does not take; load the model with attn_implementation='sdpa'"
            )
        if not all(type(layer) is DynamicLayer for layer in self._cache.layers):
            raise UnsupportedModelError(
                f"{self.model.name}: tree speculation needs full-attention KV cache layers (no "
                "sliding window or other layer state) so that a tree's accepted path can be moved "
                "into place; use chain speculation (no tree) with this model"
            )

    @torch.inference_mode()
    def forward_tree(
        self,
        sequence: Sequence[int],
        tokens: Sequence[int],
        parents: Sequence[int],
        num_logits: int,
    ) -> torch.Tensor:
        """Bring the cache up to ``sequence`` and a tree below its last token; feed what it lacks.

        The tree's nodes attend to the sequence and to their own ancestors only, at positions
        ``len(sequence) - 1 + depth`` (``quickdraft.tree.forward_layout``). A tree built level by
        level is passed whole each time: nodes already cached from the previous call (same
        sequence, same leading nodes) are not fed again.

        Args:
            sequence: the sequence so far; its last token is the root.
            tokens: ``[N]`` the tree's node tokens.
            parents: ``[N]`` their parents (``parents[i] < i``; -1: the root).
            num_logits: rows to return, counted from the last node backwards; ``N + 1`` returns
                the root's row too.

        Returns:
            ``[num_logits, V]`` logits; with ``num_logits = N + 1``, row 0 predicts the token
            after the root and row ``i + 1`` the token after node ``i``.
        """
        self._check_tree_support()
        n = len(tokens)
        assert len(parents) == n and 1 <= num_logits <= n + 1, (len(parents), n, num_logits)
        pending = self._pending_tree_nodes()
        cached = len(self.cached_ids) - pending
        reuse = 0
        if pending and cached == len(sequence) and self.cached_ids[:cached] == list(sequence):
            while (reuse < min(pending, n) and self._tree_tokens[reuse] == tokens[reuse]
                   and self._tree_parents[reuse] == parents[reuse]):
                reuse += 1
        if reuse and n - reuse >= num_logits:
            self.truncate(cached + reuse)  # drop pending nodes the new tree does not share
            tail: list[int] = []
        else:
            reuse = 0
            # The root's row needs the root fed; otherwise the sequence may be fully cached.
            keep = min(common_prefix_length(self.cached_ids, sequence), len(sequence) - (num_logits > n))
            self.truncate(keep)
            cached, tail = keep, list(sequence[keep:])
        mask, positions = forward_layout(cached, len(tail), parents, first_node=reuse)
        device, dtype = self.model.device, self.model.dtype
        fed = tail + list(tokens[reuse:])
        inputs = dict(
            input_ids=torch.tensor([fed], dtype=torch.long, device=device),  # [1, T]
            cache=self._cache,
            use_cache=True,
            attention_mask=additive_mask(mask, dtype).to(device),  # [1, 1, T, cached + T]
            position_ids=positions.unsqueeze(0).to(device),  # [1, T]
        )
        # The fed tokens go into the cache after the ``cached`` sequence tokens and ``reuse`` nodes.
        logits = self._logits(inputs, num_logits, cached + reuse)
        self.cached_ids.extend(tail)
        self.cached_ids.extend([TREE_NODE] * (n - reuse))
        self._tree_tokens = [int(t) for t in tokens]
        self._tree_parents = [int(p) for p in parents]
        self.forwards += 1
        self.positions += len(fed)
        return logits  # [num_logits, V]

    @torch.inference_mode()
    def keep_tree_path(self, path: Sequence[int]) -> None:
        """Keep the cached tree nodes ``path`` (root to deeper) after the sequence; drop the rest.

        Their keys and values move to the positions right after the sequence, where a forward
        of the path's tokens alone would have put them (each node attended to exactly its
        ancestors, at its depth's position). Nodes of ``path`` not in the cache (a last level
        that was never fed) are left out: ``forward_tail`` feeds them with the next tokens.
        """
        pending = self._pending_tree_nodes()
        start = len(self.cached_ids) - pending
        kept = [node for node in path if node < pending]
        assert kept == list(path[: len(kept)]), "a path's fed nodes are its leading nodes"
        n = len(kept)
        if kept != list(range(n)):  # nodes 0..n-1 of a chain are already in place
            source = torch.tensor(kept, device=self.model.device) + start
            for layer in self._cache.layers:
                if layer.keys is None:  # a layer sharing another's cache holds nothing
                    continue
                # [B, H, T, D]: gather first (advanced indexing copies), then write.
                layer.keys[:, :, start : start + n] = layer.keys[:, :, source]
                layer.values[:, :, start : start + n] = layer.values[:, :, source]
            if self.keep_features:
                self._features[start : start + n] = self._features[source]  # [n, H]
        self.cached_ids[start : start + n] = [self._tree_tokens[node] for node in kept]
        self.truncate(start + n)

    def keep_tree_along(self, sequence: Sequence[int]) -> None:
        """Keep the cached tree nodes that ``sequence`` goes through (see ``keep_tree_path``).

        A drafter calls this with the next step's sequence: the accepted path of its last tree
        stays cached and is not recomputed. Does nothing when no tree is pending or the cached
        sequence is not a prefix of ``sequence``.
        """
        pending = self._pending_tree_nodes()
        start = len(self.cached_ids) - pending
        if not pending or self.cached_ids[:start] != list(sequence[:start]):
            return
        self.keep_tree_path(follow(self._tree_tokens, self._tree_parents, sequence[start:]))

"""A KV cache for many sequences at once: one buffer per layer, one length per row.

Each layer holds keys and values in ``[B_cap, H, S_cap, D]`` buffers. Row ``b`` keeps its
sequence's keys and values in slots ``0 .. length[b] - 1``; a forward writes each row's new
tokens at ``length[b]``, ``length[b] + 1``, ... (gpt-fast's ``input_pos``, one per row), so
rolling back rejected drafts is moving the length, and a row's stale slots past its length are
overwritten by its next forward. A forward runs over a contiguous range of rows, so the buffers
it reads are views, never copies: all rows for a decoding step, one row for a prefill chunk.

The models see the cache through transformers' ``cache.update`` call (the attention layers
call it with the new keys and values and attend to what it returns), and each row's positions
and causal mask through the public ``position_ids`` and 4-D ``attention_mask`` arguments
(``BatchKVCache.mask``): no model code is patched.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from quickdraft.memory import config_kv_bytes_per_token

# Capacity grows in these steps, so that a join or a longer row rarely reallocates.
ROW_BLOCK = 4
SLOT_BLOCK = 64


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


class BatchKVCache:
    """Keys and values of every row, and where each forward writes.

    Args:
        config: the model's config (layers, KV heads, head size).
        dtype, device: of the buffers (the model's).

    Attributes:
        lengths: ``lengths[b]`` cached positions of row ``b`` (``rows`` rows in use).
    """

    def __init__(self, config: PretrainedConfig, dtype: torch.dtype, device: torch.device) -> None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers = text.num_hidden_layers
        self.kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.dtype = dtype
        self.device = device
        self.bytes_per_slot = config_kv_bytes_per_token(config, dtype.itemsize)
        self.lengths: list[int] = []
        self._keys: list[torch.Tensor] = []  # per layer [B_cap, H, S_cap, D]
        self._values: list[torch.Tensor] = []
        self._window = (0, 0)  # rows of the forward in progress
        self._write_index: torch.Tensor | None = None  # [b, T] slots of its new tokens, per row
        self._span = 0  # slots its rows attend over (S)

    # -- rows ------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> tuple[int, int]:
        """``(rows, slots)`` the buffers hold."""
        return (0, 0) if not self._keys else (self._keys[0].shape[0], self._keys[0].shape[2])

    @property
    def nbytes(self) -> int:
        rows, slots = self.capacity
        return rows * slots * self.bytes_per_slot

    def add_row(self) -> int:
        """A new empty row at the end; returns its index. Its buffers are reserved by the first
        forward that feeds it (``begin_forward``): a draft model's cache then grows only where
        the row drafts. Reserved here, every join of a loaded server would reallocate both
        models' buffers a block of rows at a time, most of it the draft's cache, which a batch
        that does not draft never uses."""
        self.lengths.append(0)
        return self.rows - 1

    @torch.inference_mode()
    def remove_row(self, row: int) -> int | None:
        """Drop ``row``: the last row moves into its place (one row copied). Returns the index the
        last row had (now ``row``), or None when ``row`` was the last one."""
        last = self.rows - 1
        moved = None
        if row != last:
            n = self.lengths[last]
            if n:  # a row never fed has no buffer rows yet (``add_row``), and nothing to copy
                for buffer in self._keys + self._values:
                    buffer[row, :, :n] = buffer[last, :, :n]
            self.lengths[row] = n
            moved = last
        self.lengths.pop()
        if not self.lengths:
            self.release()
        return moved

    def release(self) -> None:
        """Free the buffers (the rows must be gone)."""
        assert not self.lengths, "rows still use the cache"
        self._keys, self._values = [], []

    @torch.inference_mode()  # the buffers are inference tensors: forwards write them in place
    def reserve(self, rows: int, slots: int) -> None:
        """Make room for ``rows`` rows of ``slots`` positions (grown in blocks, never shrunk)."""
        have_rows, have_slots = self.capacity
        if rows <= have_rows and slots <= have_slots:
            return
        new_rows = max(have_rows, _round_up(rows, ROW_BLOCK))
        new_slots = max(have_slots, _round_up(slots, SLOT_BLOCK))
        shape = (new_rows, self.kv_heads, new_slots, self.head_dim)
        for buffers in (self._keys, self._values):
            for layer in range(self.num_layers):
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if layer < len(buffers):
                    grown[:have_rows, :, :have_slots] = buffers[layer]
                    buffers[layer] = grown
                else:
                    buffers.append(grown)

    @torch.inference_mode()
    def shrink(self, slots: int) -> None:
        """Give back capacity beyond the rows in use and ``slots`` positions (rounded as
        ``reserve`` rounds), so that what the buffers hold stays what ``bytes_for`` promised
        for the rows that remain. Reallocates (one copy of the cache) only when a block is freed."""
        have_rows, have_slots = self.capacity
        rows, slots = _round_up(self.rows, ROW_BLOCK), _round_up(max(slots, max(self.lengths, default=0)), SLOT_BLOCK)
        if not self.lengths or (rows >= have_rows and slots >= have_slots):
            return
        rows, slots = min(rows, have_rows), min(slots, have_slots)
        self._keys = [buffer[:rows, :, :slots].clone() for buffer in self._keys]
        self._values = [buffer[:rows, :, :slots].clone() for buffer in self._values]

    @staticmethod
    def bytes_for(rows: int, slots: int, bytes_per_slot: int) -> int:
        """What buffers for ``rows`` x ``slots`` take, as ``reserve`` rounds them."""
        return _round_up(rows, ROW_BLOCK) * _round_up(slots, SLOT_BLOCK) * bytes_per_slot

    # -- one forward -----------------------------------------------------------------------

    def begin_forward(self, first: int, fed: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepare a forward of rows ``first .. first + len(fed) - 1``, row ``i`` feeding
        ``fed[i]`` real tokens padded to ``width``.

        Returns ``position_ids`` ``[b, T]`` (``T = width``) and the additive ``attention_mask``
        ``[b, 1, T, S]``: token ``t`` of row ``i`` sits at position ``length + t`` and attends
        to slots ``0 .. length + t``. A padded token (``t >= fed[i]``) is written past the
        row's real tokens and no real token attends to it; ``end_forward`` does not count it.

        Example: lengths ``[3, 1]``, width 2 -> positions ``[[3, 4], [1, 2]]``, ``S = 5``; row 1's
        token 0 attends to slots 0 and 1, row 0's token 1 to slots 0..4.
        """
        starts = torch.tensor(self.lengths[first:first + len(fed)], device=self.device)  # [b]
        positions = starts[:, None] + torch.arange(width, device=self.device)[None, :]  # [b, T]
        span = int(max(self.lengths[first:first + len(fed)])) + width
        self.reserve(self.rows, span)
        self._window = (first, first + len(fed))
        self._write_index = positions
        self._span = span
        allowed = torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None]  # [b, T, S]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return positions, mask[:, None]

    def end_forward(self, fed: list[int]) -> None:
        """Count each row's real tokens of the forward as cached."""
        first, _ = self._window
        for i, n in enumerate(fed):
            self.lengths[first + i] += n
        self._write_index = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, kwargs=None) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' cache call: write the forward's ``[b, H, T, D]`` keys and values at each
        row's slots; return the rows' ``[b, H, S, D]`` keys and values (views)."""
        first, end = self._window
        index, span = self._write_index, self._span  # [b, T]
        scatter = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])  # [b, H, T, D]
        key_buffer = self._keys[layer_idx][first:end]
        value_buffer = self._values[layer_idx][first:end]
        key_buffer.scatter_(2, scatter, keys.to(self.dtype))
        value_buffer.scatter_(2, scatter, values.to(self.dtype))
        return key_buffer[:, :, :span], value_buffer[:, :, :span]

    @torch.inference_mode()
    def copy_prefix(self, source: int, row: int, length: int) -> None:
        """Give ``row`` the first ``length`` positions of ``source`` (which holds at least as
        many), replacing what it held."""
        if not length <= self.lengths[source]:
            raise ValueError(f"row {source} holds {self.lengths[source]} positions, not {length}")
        self.reserve(self.rows, length)
        for buffer in self._keys + self._values:
            buffer[row, :, :length] = buffer[source, :, :length]
        self.lengths[row] = length

    def truncate(self, row: int, length: int) -> None:
        """Roll ``row`` back to its first ``length`` positions."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate row {row} of {self.lengths[row]} positions to {length}")
        self.lengths[row] = length

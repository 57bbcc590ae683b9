"""A lean forward for Llama-style decoders: the same layers and cache, less Python around them.

A one-token step of a small model on a CPU spends much of its time outside the matrix products:
the demo 0.5B draft's transformers decoder forward took 20 ms, of which its int4 linear layers
took 7.6 (AMX Xeon, 2 threads). The library builds masks, dispatches attention through an
interface table, checks arguments and wraps outputs on every call. ``LeanDecoder`` runs the
model's own modules (norms, linear layers whatever their format, rotary embedding,
``DynamicCache``, or the batched engine's cache) in a straight loop: the attention is
``scaled_dot_product_attention`` over each key-value head with its group of query heads folded
into one batch of rows (no copy of the keys per query head), with no mask for one position of one
row, a causal mask for several, or the caller's additive mask (trees, a batch's rows). In a batch
of rows padded to the longest, the linear layers, norms and MLPs run over the real positions only:
a verification where a few rows drafted costs their positions, not every row padded to theirs.

Int4 layers, or GGUF block layers of one type, that read the same input (queries, keys and
values; the MLP's gate and up projections) run as one fused layer (``Int4Linear.fused``,
``BlockLinear.fused``, built once, the layers' weights then views of it): 4 kernel calls a layer
instead of 7.

Only decoders whose layers are exactly ``LlamaDecoderLayer`` or ``Qwen2DecoderLayer`` and whose
every layer attends to the whole sequence are run this way (``lean_decoder`` returns ``None``
otherwise): other families differ in norms, scaling or layer types, and run through
transformers. The result equals the transformers forward up to float rounding (the tests compare
them). ``ModelRunner`` and the batched engine's ``BatchRunner`` run every forward of such a model
through it, so plain decoding, a draft's proposals and a target's verification all use the same
arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, rotate_half
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from quickdraft.models.blocks import BlockLinear
from quickdraft.models.int4 import Int4Linear


class KVCache(Protocol):
    """What the lean forward needs of a cache: transformers' ``DynamicCache`` for one row, or
    ``quickdraft.batch.cache.BatchKVCache`` for several."""

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a layer's new ``[b, kv, T, D]`` keys and values; return ``[b, kv, S, D]`` to attend to."""

    def get_seq_length(self) -> int:
        """Positions cached (of the one row: only a causal forward asks)."""

LAYERS = (LlamaDecoderLayer, Qwen2DecoderLayer)
# Attention over at most this many (query row, key) pairs of all heads runs on one thread: that
# is microseconds of arithmetic, and as a parallel region it waits for the other threads, which
# other processes' load on a small CPU can hold off for a scheduler's time slice (milliseconds).
# A decode step's or a verification's attention stays under it up to thousands of cached tokens.
ONE_THREAD_ATTENTION = 1 << 18
# A chain of at most this many positions (a verification) attends one position at a time, each
# in the call a one-position step makes, so that a verified position's hidden state is bit for bit
# the one plain decoding computes. A masked call over several positions sums in another order,
# and where the linear layers round their inputs to int8 (GGUF blocks, as llama.cpp), a last-bit
# difference can flip a rounding and grow through the layers: on the demo target from its blocks,
# verified logits differed from plain decoding's by up to 0.4, and greedy outputs parted at
# near-ties. Longer chains (prompts) keep the one masked call: nothing compares them.
ROW_BY_ROW_POSITIONS = 32


def lean_decoder(decoder: nn.Module) -> LeanDecoder | None:
    """``LeanDecoder(decoder)`` where it computes what ``decoder`` computes, else ``None``."""
    config = decoder.config
    layers = getattr(decoder, "layers", None)
    if layers is None or not layers or not all(type(layer) in LAYERS for layer in layers):
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None  # sliding-window layers
    if config._attn_implementation not in ("sdpa", "eager") or getattr(config, "pretraining_tp", 1) != 1:
        return None
    return LeanDecoder(decoder)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (``[b, heads, T, D]``) by ``cos``/``sin`` (``[b, 1, T, D]``), as
    the family's ``apply_rotary_pos_emb`` rotates queries and keys (here both in one call)."""
    return x * cos + rotate_half(x) * sin


@contextmanager
def _one_thread(when: bool) -> Iterator[None]:
    """Inside the ``with`` block, torch runs on one thread where ``when`` holds (this thread's
    setting, restored on leaving)."""
    threads = torch.get_num_threads()
    if not when or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fused(layers: list[nn.Module]) -> nn.Module | None:
    """One layer computing ``layers`` side by side where their kind can fuse, else ``None``."""
    for kind in (Int4Linear, BlockLinear):
        if all(isinstance(layer, kind) for layer in layers):
            return kind.fused(layers)
    return None


class LeanDecoder(nn.Module):
    """Runs a supported decoder (``lean_decoder``) over fed tokens of one row or several, with their cache.

    A module so that forward hooks (``bench.measure.ForwardTimer``) see its calls.

    Args:
        decoder: the model's decoder (``model.get_decoder()``): embedding, layers, final norm
            and rotary embedding are used as they are.
    """

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder
        config = decoder.config
        attention = decoder.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = attention.scaling
        # Int4 layers that read the same input run as one (``Int4Linear.fused``): per layer,
        # queries, keys and values; the MLP's gate and up projections. None: run them apart.
        self._qkv: list[nn.Module | None] = []
        self._gate_up: list[nn.Module | None] = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._qkv.append(_fused([attn.q_proj, attn.k_proj, attn.v_proj]))
            self._gate_up.append(_fused([mlp.gate_proj, mlp.up_proj]))

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """The last layer's normed hidden states of the fed positions.

        Args:
            input_ids: ``[b, T]`` tokens continuing what ``cache`` holds (``S0`` positions a row).
            cache: the model's cache (``KVCache``); the fed positions' keys and values are
                written to it.
            position_ids: ``[b, T]`` their positions (a tree's are not consecutive).
            attention_mask: ``[b, 1, T, S]`` additive (``S`` the keys ``cache.update`` returns),
                or ``None``: causal (one row only).
            lengths: ``lengths[i]`` real positions of row ``i`` (its first ones; the rest pad it
                to ``T``), or ``None``: all. Only real positions go through the linear layers,
                norms and MLPs; padded ones enter the attention as zeros, and their keys and
                values, written past the row's real ones, are never attended to.

        Returns:
            ``[b, T, H]`` hidden states, what the output layer reads (zeros at padded positions).
        """
        decoder, (b, t) = self.decoder, input_ids.shape
        x = decoder.embed_tokens(input_ids)  # [b, T, H]
        cos, sin = decoder.rotary_emb(x, position_ids)  # [b, T, D] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, T, D]
        real = None  # [P] indexes of the real positions among the b x T, or None: all
        if lengths is not None and sum(lengths) < b * t:
            real = torch.cat([torch.arange(n, device=x.device) + i * t for i, n in enumerate(lengths)])
        x = x.reshape(b * t, -1) if real is None else x.reshape(b * t, -1)[real]  # [P, H]
        mask = attention_mask
        if mask is None and t > ROW_BY_ROW_POSITIONS:
            assert b == 1, "several rows need their attention mask"
            past = cache.get_seq_length()
            # Query i (position past + i) reads keys 0 .. past + i.
            mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(past)[None, None]  # [1, 1, T, S]
        if mask is not None:
            # Each key-value head's group of query heads attends as one batch of group x T rows
            # (``_attention``): each query row's mask repeated for the group's heads.
            group = self.heads // self.kv_heads
            mask = mask[:, :, None].expand(-1, -1, group, -1, -1).reshape(mask.shape[0], 1, group * t, mask.shape[-1])
        rows = _Rows(b, t, real)
        for index, layer in enumerate(decoder.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, cache, index, mask, rows)
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x), index)
        return rows.spread(decoder.norm(x)).view(b, t, -1)  # [b, T, H]

    def _mlp(self, mlp: nn.Module, h: torch.Tensor, index: int) -> torch.Tensor:
        """One layer's MLP of ``h`` (``[P, H]``); ``[P, H]`` out."""
        fused = self._gate_up[index]
        if fused is None:
            return mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
        gate, up = fused(h).split([mlp.gate_proj.out_features, mlp.up_proj.out_features], dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _attention(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   cache: KVCache, index: int, mask: torch.Tensor | None, rows: _Rows) -> torch.Tensor:
        """One layer's self-attention of ``h`` (``[P, H]``, the real positions of ``rows``);
        ``[P, H]`` out. ``mask``: ``[b, 1, group x T, S]`` (``forward`` repeats it for a group),
        or ``None`` for one position."""
        b, t, d = rows.b, rows.t, self.head_dim
        fused = self._qkv[index]
        if fused is None:
            qkv = torch.cat((attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)), dim=-1)  # [P, (heads + 2 kv) * D]
        else:
            qkv = fused(h)
        qkv = rows.spread(qkv).view(b, t, self.heads + 2 * self.kv_heads, d).transpose(1, 2)  # [b, heads + 2 kv, T, D]
        # Queries and keys rotate together: one rotation per layer.
        qk = _rotate(qkv[:, : self.heads + self.kv_heads], cos, sin)  # [b, heads + kv, T, D]
        q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]  # [b, heads / kv / kv, T, D]
        keys = mask.shape[-1] if mask is not None else cache.get_seq_length() + t  # S
        # The cache's append copies it (in parallel past torch's grain size): on one thread with
        # the attention it feeds, for the same reason (``ONE_THREAD_ATTENTION``).
        with _one_thread(b * self.heads * t * keys <= ONE_THREAD_ATTENTION):
            k, v = cache.update(k, v, index)  # [b, kv, S, D]
            # A key-value head's group of query heads reads it as one batch of group x T query rows
            # (heads are numbered key-value head first), with no copy of the keys per query head:
            # on the demo target's shapes, 16 rows of 2 positions, 0.15 ms a layer against 0.86 for
            # keys and values repeated per head and 0.45 for SDPA's own grouped heads.
            group = self.heads // self.kv_heads
            if mask is None and t > 1:  # a short chain: row by row (``ROW_BY_ROW_POSITIONS``)
                past = k.shape[2] - t
                q = q.reshape(b, self.kv_heads, group, t, d)
                out = torch.stack([
                    F.scaled_dot_product_attention(q[:, :, :, i].contiguous(), k[:, :, : past + i + 1],
                                                   v[:, :, : past + i + 1], scale=self.scaling)  # [b, kv, group, D]
                    for i in range(t)
                ], dim=3).view(b, self.kv_heads, group * t, d)  # [b, kv, group * T, D]
            else:
                q = q.reshape(b, self.kv_heads, group * t, d)  # [b, kv, group * T, D]
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # [b, kv, group * T, D]
        out = out.view(b, self.heads, t, d).transpose(1, 2).reshape(b * t, self.heads * d)  # [b * T, heads * D]
        return attn.o_proj(rows.gather(out))


class _Rows:
    """Where a forward's real positions sit among its ``b`` rows of ``T`` (``real``: their indexes
    in the ``b x T``, or ``None``: all are real): the linear layers run over the real ones only
    (``[P, ...]``), the attention over rows (``[b * T, ...]``)."""

    def __init__(self, b: int, t: int, real: torch.Tensor | None) -> None:
        self.b, self.t, self.real = b, t, real

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """``[P, F]`` -> ``[b * T, F]``, zeros at padded positions."""
        if self.real is None:
            return x
        out = x.new_zeros((self.b * self.t, x.shape[-1]))
        out[self.real] = x
        return out

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[b * T, F]`` -> ``[P, F]``."""
        return x if self.real is None else x[self.real]

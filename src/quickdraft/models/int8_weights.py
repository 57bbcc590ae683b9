"""Counting the weights of quantized drafts (``models.quantize``) that ``Module.parameters`` does
not list: the model record and the memory accounting both need them."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from quickdraft.models import int4
from quickdraft.models.blocks import block_weight_count


def _packed_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """Weights and biases of ``module``'s dynamic int8 layers, which ``Module.parameters`` does not list.

    Each ``layer.weight()`` unpacks a new copy of the weight: yielded one at a time, so that
    counting holds one layer's copy, not the whole model's (0.33 GiB on the demo draft).
    """
    for layer in module.modules():
        if isinstance(layer, DynamicInt8Linear):
            yield from (t for t in (layer.weight(), layer.bias()) if t is not None)


def quantized_weight_bytes(module: nn.Module) -> int:
    """Bytes of the int8 layers' weights and biases."""
    return sum(t.numel() * t.element_size() for t in _packed_tensors(module))


def unlisted_weight_count(module: nn.Module) -> int:
    """Number of the weights ``Module.parameters`` does not list: the int8, int4 and GGUF block
    layers' weights and biases, and a quantized draft's embedding and output layer, which are bfloat16
    buffers (``quantize.hold_in_bfloat16``), a tied pair counted once."""
    tables = (module.get_input_embeddings(), module.get_output_embeddings())
    held = {id(t.weight): t.weight for t in tables if t is not None and "weight" in t._buffers}
    return (sum(t.numel() for t in _packed_tensors(module)) + int4.weight_count(module)
            + sum(t.numel() for t in held.values()) + block_weight_count(module))

"""Counting the weights of dynamic int8 layers (``models.quantize``), which ``Module.parameters``
does not list: the model record and the memory accounting both need them."""

from __future__ import annotations

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear


def _packed_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Weights and biases of ``module``'s dynamic int8 layers, which ``Module.parameters`` does not list."""
    tensors = []
    for layer in module.modules():
        if isinstance(layer, DynamicInt8Linear):
            tensors += [t for t in (layer.weight(), layer.bias()) if t is not None]
    return tensors


def quantized_weight_bytes(module: nn.Module) -> int:
    """Bytes of the int8 layers' weights and biases."""
    return sum(t.numel() * t.element_size() for t in _packed_tensors(module))


def quantized_weight_count(module: nn.Module) -> int:
    """Number of the int8 layers' weights and biases."""
    return sum(t.numel() for t in _packed_tensors(module))

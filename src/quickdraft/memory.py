"""Memory accounting: what a model's weights and its KV cache take, in bytes.

Used by ``quickdraft doctor`` (is the second model worth its memory?) and by the server's
cache budget. Figures are computed from the config and the tensors, not measured.
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from quickdraft.models.base import LoadedModel
from quickdraft.models.int8_weights import quantized_weight_bytes


def module_bytes(module: nn.Module) -> int:
    """Bytes held by a module's parameters and buffers, and by its int8 layers' packed weights."""
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) + quantized_weight_bytes(module)


def weight_bytes(model: LoadedModel) -> int:
    """Bytes held by the model's parameters and buffers."""
    return module_bytes(model.module)


def config_kv_bytes_per_token(config: PretrainedConfig, element_bytes: int) -> int:
    """Bytes of KV cache one token position takes in a model of ``config``: keys and values of every layer.

    ``2 (K and V) x layers x kv_heads x head_dim x bytes per element``. Example: Qwen2.5 1.5B
    (28 layers, 2 KV heads of 128) in bfloat16 takes 2 * 28 * 2 * 128 * 2 = 28,672 bytes.
    """
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element_bytes


def kv_bytes_per_token(model: LoadedModel) -> int:
    """Bytes of KV cache one token position takes in ``model`` (``config_kv_bytes_per_token``)."""
    return config_kv_bytes_per_token(model.module.config, model.module.dtype.itemsize)


def sequence_kv_bytes(models: list[LoadedModel], tokens: int) -> int:
    """KV cache bytes for one sequence of ``tokens`` positions in every model listed."""
    return tokens * sum(kv_bytes_per_token(m) for m in models)

"""Int8 weights for a draft model on a CPU: half the bytes a bfloat16 forward reads.

At batch size 1 a forward reads every weight once per token, so on a CPU a draft step costs
about the bytes of its weights over the memory bandwidth. Dynamic int8 quantization
(``torch.ao.quantization.quantize_dynamic`` with its default configuration: int8 weights with
one scale per layer, activations quantized on the fly with one scale per forward) stores the
decoder blocks' linear layers in one byte per weight instead of two.

On the demo 0.5B draft this is the fastest int8 step measured; a scale per output row or
weight-only int8 with exact activations (``torch._weight_int8pack_mm``) agree with the target
0.01-0.04 more often and are as fast or slower (table in docs/performance.md).

The draft's predictions change a little; the output of speculative decoding does not, because
the target accepts or rejects against whatever distribution q the draft sampled from. A target
quantized this way would be a different model: quickdraft only quantizes drafts.

The embedding and the output layer stay in floating point, held in bfloat16 (``hold_in_bfloat16``):
a token's embedding is one row read, and the drafters compute only some rows of the output layer
(``runner.OutputRows``), so neither needs int8 kernels; in float32 they were 1.0 GiB of the demo
0.5B draft's 1.35 GiB (a 150k vocabulary, untied), in bfloat16 half that.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch
from torch import nn
from torch.ao.quantization import quantize_dynamic

from quickdraft.allocator import give_back_memory
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel

QUANTIZATIONS = ("none", "int8")


def check_quantization(quantization: str, dtype: torch.dtype, device: torch.device) -> None:
    """Raise ``InvalidParameterError`` unless ``quantization`` can be applied to a model loaded so."""
    if quantization not in QUANTIZATIONS:
        raise InvalidParameterError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    if quantization == "int8" and (dtype != torch.float32 or device.type != "cpu"):
        raise InvalidParameterError(
            f"int8 quantization runs on the CPU with float32 activations: load with dtype='float32' and "
            f"device='cpu' (got {dtype} on {device}), or use quantization='none'"
        )


def quantize_int8(model: LoadedModel) -> LoadedModel:
    """Replace ``model``'s linear layers but its output layer by dynamic int8 ones, in place.

    ``model`` must be a float32 model on the CPU (``check_quantization``). Returns ``model``.
    """
    check_quantization("int8", model.dtype, model.device)
    module = model.module
    output = module.get_output_embeddings()
    # Layers already int8 (``load_converted(int8=True)``) are no nn.Linear any more.
    names = {name for name, layer in module.named_modules() if isinstance(layer, nn.Linear) and layer is not output}
    _quantize_dynamic(module, names)
    hold_in_bfloat16(module)
    give_back_memory()  # the float32 tables just replaced
    return replace(model, quantization="int8")


def hold_in_bfloat16(module: nn.Module) -> None:
    """Hold a float32 model's input embedding and output layer (unless it has a bias) in bfloat16, in place.

    The forwards stay float32 around them: the embedding's rows are widened after the lookup,
    the output layer's input is narrowed and its logits widened. Each weight becomes a buffer,
    not a parameter, because transformers takes a model's dtype from its first parameter and
    that must stay the activations' float32. A tied output layer keeps sharing the embedding's
    tensor. A model already held so is left as it is.
    """
    embedding, output = module.get_input_embeddings(), module.get_output_embeddings()
    if "weight" in embedding._buffers:
        return
    tied = output is not None and output.weight is embedding.weight
    narrow = _narrow_weight(embedding)
    embedding.register_forward_hook(_widen_output)
    if output is None or getattr(output, "bias", None) is not None:
        return
    _narrow_weight(output, narrow if tied else None)
    output.register_forward_pre_hook(_narrow_input)
    output.register_forward_hook(_widen_output)


def _narrow_weight(layer: nn.Module, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Replace ``layer``'s weight parameter by a bfloat16 buffer (``weight`` if given); returns it."""
    narrow = layer.weight.detach().to(torch.bfloat16) if weight is None else weight
    del layer.weight
    layer.register_buffer("weight", narrow)
    return narrow


def _narrow_input(layer: nn.Module, args: tuple) -> tuple:
    return (args[0].to(layer.weight.dtype), *args[1:])


def _widen_output(layer: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.to(torch.float32)


def quantize_linear_int8(parent: nn.Module, name: str) -> None:
    """Replace ``parent``'s float32 linear layer ``name`` by a dynamic int8 one, in place."""
    _quantize_dynamic(parent, {name})


def _quantize_dynamic(module: nn.Module, names: set[str]) -> None:
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; its dynamic int8 linear layers
        # are what this release of torch runs, and the version is pinned.
        warnings.simplefilter("ignore")
        quantize_dynamic(module, names, dtype=torch.qint8, inplace=True)

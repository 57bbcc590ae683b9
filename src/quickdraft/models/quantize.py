"""Low-bit weights for a draft model on a CPU: fewer bytes for each draft step to read.

At batch size 1 a forward reads every weight once per token, so on a CPU a draft step costs
about the bytes of its weights over the memory bandwidth. Two formats replace the decoder
blocks' linear layers:

- ``int4`` (``quickdraft.models.int4``): 4-bit weights with a scale per 64 inputs, run by a
  compiled kernel (x86 with AVX2). 0.56 bytes a weight; on the demo 0.5B draft its layers ran
  2.4x as fast as int8's at one row and its predictions agreed with the target more often (0.79
  against 0.74 of teacher-forced positions); many rows (a prompt) are slower than int8's. The
  default where the kernel builds and oneDNN computes in bfloat16 (``hardware.choose_config``).
- ``int8``: torch's dynamic int8 quantization (``torch.ao.quantization.quantize_dynamic`` with
  its default configuration: int8 weights with one scale per layer, activations quantized on the
  fly with one scale per forward), one byte a weight, on any CPU torch has a quantized engine
  for. A scale per output row or weight-only int8 with exact activations
  (``torch._weight_int8pack_mm``) agreed with the target 0.01-0.04 more often and were as fast or
  slower (table in docs/performance.md).

The draft's predictions change a little; the output of speculative decoding does not, because
the target accepts or rejects against whatever distribution q the draft sampled from. A target
quantized this way would be a different model: quickdraft only quantizes drafts.

The embedding and the output layer stay in floating point, held in bfloat16 (``hold_in_bfloat16``):
a token's embedding is one row read, and the drafters compute only some rows of the output layer
(``runner.OutputRows``), so neither needs low-bit kernels; in float32 they were 1.0 GiB of the demo
0.5B draft's 1.35 GiB (a 150k vocabulary, untied), in bfloat16 half that.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn
from torch.ao.quantization import quantize_dynamic

from quickdraft.allocator import give_back_memory
from quickdraft.errors import InvalidParameterError
from quickdraft.kernels import int4_kernel
from quickdraft.models.base import LoadedModel
from quickdraft.models.int4 import Int4Linear
from quickdraft.models.packing import native_bfloat16

QUANTIZATIONS = ("none", "int8", "int4")


def check_quantization(quantization: str, dtype: torch.dtype, device: torch.device) -> None:
    """Raise ``InvalidParameterError`` unless ``quantization`` can be applied to a model loaded so."""
    if quantization not in QUANTIZATIONS:
        raise InvalidParameterError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    if quantization != "none" and (dtype != torch.float32 or device.type != "cpu"):
        raise InvalidParameterError(
            f"{quantization} quantization runs on the CPU with float32 activations: load with dtype='float32' and "
            f"device='cpu' (got {dtype} on {device}), or use quantization='none'"
        )
    if quantization == "int4" and int4_kernel() is None:
        raise InvalidParameterError(
            "int4 quantization needs the compiled int4 kernel, which does not run here (an x86 CPU with AVX2 and a "
            "C compiler; QUICKDRAFT_KERNELS=0 turns it off): use quantization='int8'"
        )


def quantize(model: LoadedModel, quantization: str) -> LoadedModel:
    """Replace ``model``'s linear layers but its output layer by ``quantization``'s ("int8" or
    "int4"), in place, and hold its embedding and output layer in bfloat16.

    ``model`` must be a float32 model on the CPU (``check_quantization``). Returns ``model``.
    """
    check_quantization(quantization, model.dtype, model.device)
    module = model.module
    output = module.get_output_embeddings()
    # Layers already replaced (``load_converted`` with ``linear_quantizer``) are no nn.Linear any more.
    places = [(parent, name) for parent in module.modules() for name, child in parent.named_children()
              if isinstance(child, nn.Linear) and child is not output]
    replace_layer = linear_quantizer(quantization)
    for parent, name in places:
        replace_layer(parent, name)
    hold_in_bfloat16(module)
    give_back_memory()  # the float32 tables just replaced
    return replace(model, quantization=quantization)


def linear_quantizer(quantization: str) -> Callable[[nn.Module, str], None]:
    """What replaces a float32 linear layer ``name`` of ``parent`` in place, for "int8" or "int4"."""
    return quantize_linear_int4 if quantization == "int4" else quantize_linear_int8


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
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; its dynamic int8 linear layers
        # are what this release of torch runs, and the version is pinned.
        warnings.simplefilter("ignore")
        quantize_dynamic(parent, {name}, dtype=torch.qint8, inplace=True)


def quantize_linear_int4(parent: nn.Module, name: str) -> None:
    """Replace ``parent``'s float32 linear layer ``name`` by an ``Int4Linear``, in place."""
    kernel = int4_kernel()
    assert kernel is not None, "check_quantization first"
    wide = torch.bfloat16 if native_bfloat16(torch.device("cpu")) else torch.float32
    setattr(parent, name, Int4Linear(getattr(parent, name), kernel, wide))

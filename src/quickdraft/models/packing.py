"""Linear layers on a CPU with their weights reordered once into oneDNN's layout, not at every call.

bfloat16: a plain ``nn.Linear`` hands oneDNN a row-major weight, which oneDNN reorders into its
blocked layout for the matrix unit (AMX, AVX-512 BF16) on every call: at batch size 1 that copy
reads and writes the whole weight and costs as much as the product itself. Reordering each
weight once at load time and calling oneDNN's linear on the packed weight (what
``torch.compile``'s CPU backend does for low-precision weights) runs the decoder blocks of the
demo 1.5B target about 1.5x as fast per token on an AVX-512 BF16 CPU, with bit-identical
results there: the same kernel computes the same sums; only the per-call copy is gone. On an
AMX CPU packing gained about 15% on the same model, and its one- and six-row products run
another kernel whose sums differ from the stock layer's in the last bits.

float32: the stock layer runs one row as MKL's matrix-vector product, which reads each weight
once, but two to nine rows as a matrix product that, restricted to AVX2, packs the weight on
every call: verifying 2 draft tokens cost 2.2x a one-token step on a stack of the 1.5B target's
layer shapes, 6 tokens 2.0x. oneDNN on a packed weight ran 2 tokens at 1.4x and 6 at 1.6x, one
token as fast as MKL (docs/hardware.md): what makes speculation pay where there is no bfloat16.

Whether packing pays is timed per machine and format (``quickdraft.hardware``); speculation
stays exact either way, since the plain and the speculative path run the same packed model.

The output layer stays a plain ``nn.Linear``: its weight is usually tied to the input embedding,
which a packed copy would duplicate. The drafters compute only some of its rows
(``runner.OutputRows``), and pack those.
"""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.models.base import LoadedModel


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model in ``dtype`` on ``device`` can get packed weights: float32 on a CPU with
    oneDNN, bfloat16 on a CPU whose oneDNN computes in bfloat16."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[out, in]``, float32 or bfloat16) reordered into oneDNN's layout for ``packed_linear``."""
    # The batch-size hint picks oneDNN's blocking: 1, because decoding feeds one token (or a
    # few draft tokens) per forward; a long prefill runs as fast as the plain layer anyway.
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a ``pack_weight`` result: ``[..., in]`` -> ``[..., out]``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class PackedLinear(nn.Module):
    """A linear layer whose weight is held in oneDNN's blocked layout.

    Args:
        linear: the layer to replace; its weight is reordered (a new tensor) and its bias kept.

    Attributes:
        weight: ``[out_features, in_features]`` as an opaque oneDNN tensor (``is_mkldnn``):
            ``numel`` and ``element_size`` hold, indexing does not.
        bias: ``[out_features]`` or ``None``.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = nn.Parameter(pack_weight(linear.weight), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]``."""
        return packed_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear_layers(model: LoadedModel) -> LoadedModel:
    """Replace ``model``'s linear layers but its output layer by ``PackedLinear``, in place.

    ``model`` must satisfy ``can_pack``. Returns ``model``.
    """
    assert can_pack(model.dtype, model.device), (model.dtype, model.device)
    output = model.module.get_output_embeddings()
    # (parent, name) pairs, not the layers: each plain weight is freed as soon as its packed
    # copy replaces it, so packing holds one layer twice, not the whole model (+2.4 GB on the
    # demo 1.5B target when the list held every layer).
    places = [(parent, name) for parent in model.module.modules() for name, child in parent.named_children()
              if type(child) is nn.Linear and child is not output]
    for parent, name in places:
        pack_linear(parent, name)
    return model


def pack_linear(parent: nn.Module, name: str) -> None:
    """Replace ``parent``'s linear layer ``name`` by a ``PackedLinear``, in place."""
    setattr(parent, name, PackedLinear(getattr(parent, name)))


def has_packed_layers(model: LoadedModel) -> bool:
    """Whether ``pack_linear_layers`` changed ``model``: it runs layers transformers does not ship."""
    return any(isinstance(layer, PackedLinear) for layer in model.module.modules())

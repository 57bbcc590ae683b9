"""Linear layers prepared once for the CPU they run on: weights reordered into oneDNN's layout
(not at every call) or into AMX tiles, or bfloat16 layers widened to float32 for many-row products.

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

bfloat16 where oneDNN has no bfloat16 instructions (AVX2, AVX-512 without BF16): one row runs as
the stock layer's matrix-vector product, which reads the weight's 2 bytes per entry and converts
as it goes, the fastest one-token step there (a third faster than float32 on an AVX2 CPU). The
stock layer's product of several rows computes each element with conversions and slows with
every row: six rows cost 3.8 one-row steps, 64 rows 32. ``WidenedLinear`` keeps the bfloat16
weight and, from ``WIDEN_FROM_ROWS`` rows, converts it to float32 a block of rows at a time into
a scratch buffer and runs MKL's float32 product on each block: a prompt then fills at float32's
speed (64 rows: 0.4 s against 1.7 on the demo target's layer shapes, AVX2) with bfloat16's
memory and one-token step. Up to ``KERNEL_MAX_ROWS`` rows it runs a compiled kernel instead
(``quickdraft.kernels``) that reads each bfloat16 weight once for all rows and widens it in
registers: six rows at 1.6 one-row steps instead of 4.8, and each row's sums in the same order
whatever the rows beside it, so a verification's rows equal plain decoding's bit for bit.

bfloat16 on a CPU with AMX-BF16 tiles: ``TiledLinear`` holds each weight as tiles laid out once
(``quickdraft.kernels.bf16_tiles_kernel``) and multiplies up to 32 rows per pass over it. oneDNN's
packed layers grew with the rows from 16 on (the demo target's layers: 107 ms for 16 rows, 134
for 32, 162 for 64; the tiles 97, 105, 146, and 0.89x oneDNN's one-row step), which is what a
batched server's verification of several positions per row pays. From 128 rows on (prompts) the
tiles run 3-4% slower than oneDNN. Each row's sums run in the same order whatever the rows beside
it, so a verification's rows equal plain decoding's bit for bit.

The output layer stays a plain ``nn.Linear`` where packing copies its weight: it is usually tied
to the input embedding, which a packed copy would duplicate (a widened one holds no copy). The
drafters compute only some of its rows (``runner.OutputRows``), and pack those.
"""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.kernels import bf16_rows_kernel, bf16_tiles_kernel
from quickdraft.models.base import LoadedModel
from quickdraft.models.widening import widened_product

# From this many rows a ``WidenedLinear`` computes in float32. Measured on the demo target's layer
# shapes restricted to AVX2 (ms for 1 / 2 / 6 / 9 rows): stock bfloat16 44 / 76 / 185 / 269,
# widened 107 / 145 / 158 / 195; the stock product wins below about four rows.
WIDEN_FROM_ROWS = 4
# Up to this many rows a ``WidenedLinear`` runs the compiled few-row kernel where it builds
# (``quickdraft.kernels``): on the demo target's layer shapes on an AVX2 AMD EPYC (ms for 1 / 2 /
# 6 / 16 / 32 / 64 rows), kernel 23.5 / 26.8 / 38.1 / 72.5 / 138 / 283, stock bfloat16 24.3 / 42.5 /
# 115.8 / 296 / - / -, widened 39 / 46 / 96 / 118 / 166 / 330. A prompt's longer forwards stay widened.
KERNEL_MAX_ROWS = 32


def native_bfloat16(device: torch.device) -> bool:
    """Whether oneDNN computes in bfloat16 on ``device`` (AVX-512 BF16, AMX): packed bfloat16 layers."""
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model in ``dtype`` on ``device`` can get packed weights: float32 on a CPU with
    oneDNN; bfloat16 on any CPU (``PackedLinear`` where oneDNN computes in bfloat16, else
    ``WidenedLinear``)."""
    if device.type != "cpu":
        return False
    return dtype == torch.bfloat16 or (dtype == torch.float32 and torch.backends.mkldnn.is_available())


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[out, in]``, float32 or bfloat16) reordered into oneDNN's layout for ``packed_linear``."""
    # The batch-size hint picks oneDNN's blocking: 1, because decoding feeds one token (or a
    # few draft tokens) per forward; a long prefill runs as fast as the plain layer anyway.
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a ``pack_weight`` result: ``[..., in]`` -> ``[..., out]``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class PreparedLinear(nn.Module):
    """What ``pack_linear_layers`` puts in place of an ``nn.Linear``: its shape and bias, and a
    weight the subclass holds as it runs it (``PackedLinear``, ``WidenedLinear``)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.bias = linear.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class PackedLinear(PreparedLinear):
    """A linear layer whose weight is held in oneDNN's blocked layout.

    Args:
        linear: the layer to replace; its weight is reordered (a new tensor) and its bias kept.

    Attributes:
        weight: ``[out_features, in_features]`` as an opaque oneDNN tensor (``is_mkldnn``):
            ``numel`` and ``element_size`` hold, indexing does not.
        bias: ``[out_features]`` or ``None``.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.weight = nn.Parameter(pack_weight(linear.weight), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]``."""
        return packed_linear(x, self.weight, self.bias)


class WidenedLinear(PreparedLinear):
    """A bfloat16 linear layer for a CPU without bfloat16 instructions (module docstring): up to
    ``KERNEL_MAX_ROWS`` rows by the compiled few-row kernel (``quickdraft.kernels``; where it
    does not build, one to ``WIDEN_FROM_ROWS - 1`` rows as the stock layer computes them), more in
    float32 block by block. Either way the sums are float32's and the output is rounded to
    bfloat16; only their order differs between the paths, by the last bits.

    Args:
        linear: the bfloat16 layer to replace; its weight and bias are kept, not copied.

    Attributes:
        weight: ``[out_features, in_features]`` bfloat16.
        bias: ``[out_features]`` or ``None``.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.weight = linear.weight.requires_grad_(False)  # the parameter itself: a tied one stays tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]``, in ``x``'s dtype."""
        rows = x.numel() // self.in_features
        if rows <= KERNEL_MAX_ROWS and (kernel := bf16_rows_kernel()) is not None and self.weight.is_contiguous():
            out = kernel(x.reshape(rows, self.in_features).float().contiguous(), self.weight)  # [rows, out]
            result = out if self.bias is None else out + self.bias.float()
            return result.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if rows < WIDEN_FROM_ROWS:
            return nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).float()
        out = widened_product(flat, self.out_features, lambda block, start, stop: block.copy_(self.weight[start:stop]))
        result = out if self.bias is None else out + self.bias.float()
        return result.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class TiledLinear(PreparedLinear):
    """A bfloat16 linear layer held as AMX tiles (``quickdraft.kernels.bf16_tiles_kernel``): float32
    sums over the inputs in one order whatever the number of rows, rounded once to bfloat16 with
    the bias added, as the stock layer rounds.

    Args:
        linear: the bfloat16 layer to replace; its weight is laid out as tiles (a new tensor),
            its bias kept (and a float32 copy for the kernel).

    Attributes:
        weight: the tiles, a flat bfloat16 tensor of ``out_features x in_features`` elements
            (each rounded up to a multiple of 32).
        bias: ``[out_features]`` or ``None``.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.kernel = bf16_tiles_kernel()
        assert self.kernel is not None and linear.weight.dtype == torch.bfloat16
        self.weight = nn.Parameter(self.kernel.pack(linear.weight), requires_grad=False)
        self._bias = None if linear.bias is None else linear.bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` bfloat16 -> ``[..., out_features]`` bfloat16."""
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features).to(torch.bfloat16).contiguous()
        return self.kernel.linear(flat, self.weight, self._bias, self.out_features).reshape(*x.shape[:-1], self.out_features)


def packed_layer(linear: nn.Linear) -> PreparedLinear:
    """``linear`` (float32 or bfloat16, ``can_pack``) as this CPU runs it fastest with packed
    weights: ``TiledLinear`` for bfloat16 where the CPU has AMX tiles, ``WidenedLinear`` for
    bfloat16 without native bfloat16, else ``PackedLinear``."""
    if linear.weight.dtype == torch.bfloat16 and not native_bfloat16(linear.weight.device):
        return WidenedLinear(linear)
    if linear.weight.dtype == torch.bfloat16 and bf16_tiles_kernel() is not None:
        return TiledLinear(linear)
    return PackedLinear(linear)


def pack_linear_layers(model: LoadedModel) -> LoadedModel:
    """Replace ``model``'s linear layers by ``packed_layer``'s, in place: all but the output layer,
    which is widened too where that holds no copy (``WidenedLinear`` keeps the weight itself, so
    a tied output layer stays tied; verifying several positions runs the 150k-row layer of the
    demo target in float32 blocks then).

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
    if type(output) is nn.Linear and isinstance(widened := packed_layer(output), WidenedLinear):
        model.module.set_output_embeddings(widened)
    return model


def pack_linear(parent: nn.Module, name: str) -> None:
    """Replace ``parent``'s linear layer ``name`` by ``packed_layer``'s, in place."""
    setattr(parent, name, packed_layer(getattr(parent, name)))


def has_packed_layers(model: LoadedModel) -> bool:
    """Whether ``pack_linear_layers`` changed ``model``: it runs layers transformers does not ship."""
    return any(isinstance(layer, PreparedLinear) for layer in model.module.modules())

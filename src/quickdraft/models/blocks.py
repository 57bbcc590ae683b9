"""Linear layers and embeddings that hold a GGUF file's own quantized blocks and compute from them.

A 4-bit GGUF (Q4_K_M: Q4_K and Q6_K tensors; Q4_0; Q8_0 as 8-bit) is the model that llama.cpp
runs. Dequantizing it to bfloat16 reads 3 GB per decode step for the 1.5B demo target, and
re-quantizing it to another 4-bit format would make a different model. ``BlockLinear`` keeps the
file's bytes as they are (one row of blocks per output) and multiplies with the compiled kernel
(``quickdraft.kernels.block_kernel``): each activation row is quantized to int8 per 256 inputs and
dotted with the blocks' integers, as ggml does. Every number of rows runs there (16 at a time
per pass over a weight row), so a verification of K + 1 positions reads the weights once.
``BlockEmbedding`` looks rows up by dequantizing only those rows.

Shapes: ``blocks [out_features, row_bytes]`` uint8, ``row_bytes`` = ``in_features`` / the type's
block size x its bytes per block (Q4_K: 144 per 256 weights, Q6_K: 210, Q4_0: 18 per 32, Q8_0: 34).
"""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.kernels import BlockKernel


class BlockLinear(nn.Module):
    """A linear layer whose weight is a GGUF tensor's blocks; float32 in and out.

    Args:
        blocks: ``[out_features, row_bytes]`` uint8, the file's rows of blocks.
        kind: the ggml type number (``BlockKernel.TYPES``).
        in_features: inputs of a row.
        kernel: the compiled kernel (``block_kernel()``).
        bias: ``[out_features]`` float32, or ``None``.
    """

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int, kernel: BlockKernel,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        assert blocks.dtype == torch.uint8 and blocks.shape[1] == kernel.row_bytes(kind, in_features) > 0, \
            (blocks.dtype, blocks.shape, kind, in_features)
        self.in_features, self.out_features, self.kind, self.kernel = in_features, blocks.shape[0], kind, kernel
        self.register_buffer("blocks", blocks.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def fused(cls, layers: list[BlockLinear]) -> BlockLinear | None:
        """One layer computing ``layers`` (same inputs, same block type) side by side: its rows
        are theirs concatenated (a lossless copy), in one kernel call instead of ``len(layers)``.
        The given layers' blocks become views of the fused layer's, so none is held twice.
        ``None`` when the layers' types differ (Q4_K_M mixes Q4_K and Q6_K)."""
        first = layers[0]
        if any(layer.kind != first.kind or layer.in_features != first.in_features for layer in layers):
            return None
        whole = torch.cat([layer.blocks for layer in layers])
        bias = None
        if any(layer.bias is not None for layer in layers):
            bias = torch.cat([layer.bias if layer.bias is not None else torch.zeros(layer.out_features)
                              for layer in layers])
        fused = cls(whole, first.kind, first.in_features, first.kernel, bias)
        start = 0
        for layer in layers:
            layer.blocks = fused.blocks[start : start + layer.out_features]
            if layer.bias is not None:
                layer.bias = fused.bias[start : start + layer.out_features]
            start += layer.out_features
        return fused

    @property
    def weight(self) -> torch.Tensor:
        """``[out_features, in_features]`` float32, dequantized anew on each call: for code that
        reads some rows of an output layer (a restricted vocabulary), not for the forward."""
        return self.kernel.dequantize(self.blocks, self.kind, torch.arange(self.out_features), self.in_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}, "
                f"bias={self.bias is not None}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]`` float32."""
        flat = x.reshape(-1, self.in_features).float().contiguous()  # [rows, in]
        out = self.kernel.linear(flat, self.blocks, self.kind)  # [rows, out]
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class BlockEmbedding(nn.Module):
    """A token embedding whose table is a GGUF tensor's blocks: a lookup dequantizes only the
    rows asked for (float32 out).

    Args:
        blocks: ``[num_embeddings, row_bytes]`` uint8.
        kind: the ggml type number.
        embedding_dim: the width of a row.
        kernel: the compiled kernel.
    """

    def __init__(self, blocks: torch.Tensor, kind: int, embedding_dim: int, kernel: BlockKernel) -> None:
        super().__init__()
        assert blocks.dtype == torch.uint8 and blocks.shape[1] == kernel.row_bytes(kind, embedding_dim) > 0
        self.num_embeddings, self.embedding_dim, self.kind, self.kernel = blocks.shape[0], embedding_dim, kind, kernel
        self.register_buffer("blocks", blocks.contiguous())

    @property
    def weight(self) -> torch.Tensor:
        """``[num_embeddings, embedding_dim]`` float32, dequantized anew on each call (see
        ``BlockLinear.weight``)."""
        return self.kernel.dequantize(self.blocks, self.kind, torch.arange(self.num_embeddings), self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, kind={self.kind}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [...]`` int64 -> ``[..., embedding_dim]`` float32."""
        rows = self.kernel.dequantize(self.blocks, self.kind, ids.reshape(-1), self.embedding_dim)
        return rows.view(*ids.shape, self.embedding_dim)


def block_weight_count(module: nn.Module) -> int:
    """Weights (and biases) held as blocks in ``module``, which ``Module.parameters`` does not list;
    a table shared by the embedding and the output layer counted once."""
    seen, count = set(), 0
    for layer in module.modules():
        if isinstance(layer, (BlockLinear, BlockEmbedding)):
            if layer.blocks.data_ptr() not in seen:
                seen.add(layer.blocks.data_ptr())
                width = layer.in_features if isinstance(layer, BlockLinear) else layer.embedding_dim
                count += layer.blocks.shape[0] * width
            if isinstance(layer, BlockLinear) and layer.bias is not None:
                count += layer.out_features
    return count

"""Int4 linear layers for a draft model on an x86 CPU: 0.56 bytes a weight, read at the memory's speed.

A draft's one-token step reads each weight once, so on a CPU it costs about the bytes of its
weights over the memory bandwidth. ``Int4Linear`` holds each weight as a 4-bit integer with one
float32 scale per 64 inputs (``quantize_weight``) and multiplies one to ``KERNEL_MAX_ROWS`` rows
with the compiled kernel (``quickdraft.kernels.int4_kernel``), which quantizes each row of the
input to int8 and sums integer products per group. More rows (a draft reading a prompt) are
widened a block of outputs at a time and multiplied in bfloat16 where the CPU has bfloat16 matrix
units, else in float32 (``widening.widened_product``).

On the demo 0.5B draft (AMX Xeon, 2 threads, 24 layers of distinct weights, one row) its linear
layers take 7.6 ms against 18.5 for torch's dynamic int8 layers, and its greedy predictions agree
with the target's more often: 0.79 of the positions of six teacher-forced generations against
0.74 (float32 0.82). Dynamic int8 keeps one scale for a whole weight matrix; a scale per 64
inputs follows the rows and columns whose weights are large. The target's output is unchanged
either way: it accepts or rejects against the distribution the draft sampled from.
"""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.kernels import Int4Kernel
from quickdraft.models.widening import widened_product

# Up to this many rows the kernel runs (any number where it runs on AMX tiles, ``Int4Kernel.amx``:
# faster than widening at every size); more are widened block by block: past 16 rows the kernel's
# per-row integer products cost more than widening the weights once (docs/design.md).
KERNEL_MAX_ROWS = 16
# Divisors of a group's largest magnitude tried as its scale; the one with the least squared error
# is kept (amax / 7 alone rounds the largest weight exactly and the many small ones coarsely).
SCALE_DIVISORS = (7.0, 7.5, 8.0)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight [out, in]`` as the kernel holds it (``int4_rows.c``): ``(packed [out, padded / 2]
    uint8, scale [out, padded / GROUP] float32, corr [out] float32)``, ``padded`` = ``in`` rounded up to
    a multiple of ``Int4Kernel.PAIR`` (zeros)."""
    group, pair = Int4Kernel.GROUP, Int4Kernel.PAIR
    out, inputs = weight.shape
    padded = -(-inputs // pair) * pair
    groups = nn.functional.pad(weight.detach().float(), (0, padded - inputs)).reshape(out, padded // group, group)
    amax = groups.abs().amax(-1, keepdim=True)  # [out, groups, 1]
    best_q, best_scale, best_error = None, None, None
    for divisor in SCALE_DIVISORS:
        scale = torch.where(amax > 0, amax / divisor, torch.ones_like(amax))
        q = torch.clamp(torch.round(groups / scale), -8, 7)
        error = ((q * scale - groups) ** 2).sum(-1, keepdim=True)
        if best_q is None:
            best_q, best_scale, best_error = q, scale, error
        else:
            better = error < best_error
            best_q = torch.where(better, q, best_q)
            best_scale = torch.where(better, scale, best_scale)
            best_error = torch.minimum(error, best_error)
    nibbles = (best_q + 8).to(torch.uint8).reshape(out, padded // pair, 2, group)
    packed = (nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)).reshape(out, padded // 2)
    scale = best_scale.squeeze(-1)
    corr = 128 * (scale * best_q.sum(-1)).sum(-1)
    return packed.contiguous(), scale.contiguous(), corr.contiguous()


def dequantize_weight(packed: torch.Tensor, scale: torch.Tensor, inputs: int) -> torch.Tensor:
    """``quantize_weight``'s result back as float32 ``[out, inputs]``: what the layer multiplies by."""
    group = Int4Kernel.GROUP
    out = packed.shape[0]
    nibbles = torch.stack([packed & 15, packed >> 4], dim=1)  # [out, 2, padded / 2]
    pairs = nibbles.reshape(out, 2, -1, group).transpose(1, 2)  # [out, padded / pair, 2, group]
    q = pairs.reshape(out, -1, group).float() - 8  # [out, groups, group]
    return (q * scale.unsqueeze(-1)).reshape(out, -1)[:, :inputs]


class Int4Linear(nn.Module):
    """A linear layer with int4 weights (module docstring), float32 in and out.

    Args:
        linear: the float32 layer to replace; its weight is quantized, its bias kept.
        kernel: the compiled kernel (``int4_kernel()``).
        wide_dtype: what more than ``KERNEL_MAX_ROWS`` rows are multiplied in: bfloat16 where
            the CPU has bfloat16 matrix units (the demo draft reading 256 positions on the AMX
            Xeon: 0.39 s in bfloat16, 0.99 s in float32), else float32.

    Attributes:
        packed: ``[out_features, padded / 2]`` uint8, two 4-bit weights a byte.
        scale: ``[out_features, padded / 64]`` float32, one per 64 inputs.
        corr: ``[out_features]`` float32, the kernel's correction for its unsigned inputs.
        bias: ``[out_features]`` float32 or ``None``.
    """

    def __init__(self, linear: nn.Linear, kernel: Int4Kernel, wide_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel, self.wide_dtype = kernel, wide_dtype
        packed, scale, corr = quantize_weight(linear.weight)
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.register_buffer("corr", corr)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    @classmethod
    def fused(cls, layers: list[Int4Linear]) -> Int4Linear:
        """One layer computing ``layers`` (same inputs) side by side: its output is theirs
        concatenated, in one kernel call instead of ``len(layers)`` (each call costs about 15 us
        beyond its bytes on the demo draft's shapes). The given layers' weights become views of
        the fused layer's, so no weight is held twice; layers fused before (the same model
        wrapped twice) share those weights again."""
        first = layers[0]
        assert all(layer.in_features == first.in_features and layer.kernel is first.kernel for layer in layers)
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.in_features, fused.out_features = first.in_features, sum(layer.out_features for layer in layers)
        fused.kernel, fused.wide_dtype = first.kernel, first.wide_dtype
        with_bias = any(layer.bias is not None for layer in layers)
        for name in ("packed", "scale", "corr", "bias"):
            if name == "bias" and not with_bias:
                fused.register_buffer("bias", None)
                continue
            parts = [getattr(layer, name) if name != "bias" or layer.bias is not None
                     else torch.zeros(layer.out_features) for layer in layers]
            starts = [sum(part.shape[0] for part in parts[:i]) for i in range(len(parts))]
            base = parts[0]._base
            if base is not None and starts[-1] + parts[-1].shape[0] == base.shape[0] and all(
                    part._base is base and part.data_ptr() == base[start].data_ptr()
                    for part, start in zip(parts, starts)):
                fused.register_buffer(name, base)  # views of one fused buffer already, in order
                continue
            whole = torch.cat(parts)  # along the outputs
            fused.register_buffer(name, whole)
            for layer, part, start in zip(layers, parts, starts):
                setattr(layer, name, whole[start : start + part.shape[0]])
        return fused

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]`` float32."""
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features).float().contiguous()
        out = self.kernel.linear(flat, self.packed, self.scale, self.corr) \
            if rows <= KERNEL_MAX_ROWS or self.kernel.amx else self._widened(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _widened(self, flat: torch.Tensor) -> torch.Tensor:
        """Many rows: the weight widened to float32 a block of outputs at a time, times ``flat``."""
        return widened_product(flat, self.out_features, lambda block, start, stop: self.kernel.dequantize(
            self.packed, self.scale, start, stop, block), self.wide_dtype)


def weight_count(module: nn.Module) -> int:
    """Weights (and biases) of ``module``'s int4 layers, which ``Module.parameters`` does not list."""
    return sum(layer.in_features * layer.out_features + (0 if layer.bias is None else layer.out_features)
               for layer in module.modules() if isinstance(layer, Int4Linear))

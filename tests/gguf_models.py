"""Tiny GGUF files for the block-kernel tests: a random Qwen2 or Llama, its matrices quantized
in-process to the block types the kernel runs (Q4_K by a small reference quantizer here; Q4_0 and
Q8_0 by the ``gguf`` package), written with ``gguf.GGUFWriter``. No tokenizer."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def quantize_q4_k(weight: np.ndarray) -> np.ndarray:
    """``weight [out, in]`` float32 (``in`` a multiple of 256) as Q4_K blocks ``[out, in / 256 * 144]``
    uint8: per 32 weights a 6-bit scale and min (relative to the block's fp16 d and dmin), 4-bit q.
    Plain rounding, not llama.cpp's search: any valid block is a model the kernel must run."""
    out, inputs = weight.shape
    x = weight.astype(np.float32).reshape(out, inputs // 256, 8, 32)
    low = np.minimum(x.min(-1), 0.0)  # [out, nb, 8]
    scale = (x.max(-1) - low) / 15.0
    mins = -low
    d = (scale.max(-1) / 63.0).astype(np.float16)  # [out, nb]
    dmin = (mins.max(-1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.round(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.round(np.divide(mins, dmin32, out=np.zeros_like(mins), where=dmin32 > 0)), 0, 63).astype(np.uint8)
    step = (d32 * sc)[..., None]
    q = np.divide(x + (dmin32 * m)[..., None], step, out=np.zeros_like(x), where=step > 0)
    q = np.clip(np.round(q), 0, 15).astype(np.uint8).reshape(out, inputs // 256, 4, 2, 32)
    blocks = np.zeros((out, inputs // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = d.view(np.uint8).reshape(out, -1, 2)
    blocks[..., 2:4] = dmin.view(np.uint8).reshape(out, -1, 2)
    packed = np.zeros((out, inputs // 256, 12), dtype=np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 0xF) | ((m[..., 4:] & 0xF) << 4)
    blocks[..., 4:16] = packed
    blocks[..., 16:] = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).reshape(out, -1, 128)
    return blocks.reshape(out, -1)


def quantize(weight: np.ndarray, kind: T) -> np.ndarray:
    """``weight [out, in]`` as blocks of ``kind`` (Q4_K here, others by the gguf package)."""
    if kind == T.Q4_K:
        return quantize_q4_k(weight)
    return gguf.quants.quantize(weight.astype(np.float32), kind)


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's order for a llama query or key matrix (rows interleaved per head)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, seed: int, arch: str = "qwen2", vocab_size: int = 8, hidden: int = 256,
                    kinds: dict[str, T] | None = None, init_scale: float = 0.08,
                    tied: bool = False) -> tuple[Path, torch.nn.Module]:
    """A random two-layer ``arch`` model written to ``path`` as GGUF, and the transformers model
    whose weights are the file's, dequantized (the reference the blocks must compute). ``kinds``:
    block type by GGUF tensor stem (``attn_v``, ``output``, ``token_embd``, ...; default Q4_K),
    so that a test can mix types as Q4_K_M does. Norm weights and biases are float32."""
    kinds = kinds or {}
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=init_scale, tie_word_embeddings=tied, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    if arch == "qwen2":
        module = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        module = LlamaForCausalLM(LlamaConfig(**common))
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    for name, tensor in module.state_dict().items():
        value = tensor.detach().float().numpy()
        if name == "lm_head.weight" and tied:
            continue
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            module_name, _, what = rest.rpartition(".")
            stem = _GGUF_NAMES[module_name]
            gguf_name = f"blk.{layer}.{stem}.{what}"
        else:
            stem = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm",
                    "lm_head.weight": "output"}[name]
            what, gguf_name = "weight", f"{stem}.weight"
        if value.ndim != 2:
            writer.add_tensor(gguf_name, value)
            continue
        kind = kinds.get(stem, T.Q4_K)
        # Each row is quantized on its own: the permuted rows' blocks are the rows' blocks.
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(gguf.quants.dequantize(quantize(value, kind), kind)))
        if arch == "llama" and stem in ("attn_q", "attn_k"):
            value = _permute(value, 4 if stem == "attn_q" else 2)
        writer.add_tensor(gguf_name, quantize(value, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, module.eval()

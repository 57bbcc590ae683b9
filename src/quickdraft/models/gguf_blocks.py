"""Load a GGUF file's model from its own quantized blocks: the model llama.cpp runs, not a widened copy.

``load_gguf_blocks`` builds the transformers model of the file's config with empty weights, then
puts each tensor in as the file holds it: a matrix whose type the block kernel runs (Q4_K, Q6_K,
Q4_0, Q8_0; ``BlockKernel.TYPES``) becomes a ``BlockLinear`` (the output layer included) or a
``BlockEmbedding`` holding the file's bytes, copied once and never re-rounded; every other tensor
(norms and biases in float32, matrices of other types such as Q5_0 or F16) is dequantized by the
``gguf`` package into the float32 model. The activations are float32.

Families: ``qwen2`` and ``llama`` (whose query and key rows llama.cpp's converter permuted: the
rows are put back in transformers' order, a lossless reordering of whole rows).
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import torch
from torch import nn
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from quickdraft.allocator import give_back_memory
from quickdraft.kernels import BlockKernel
from quickdraft.models.blocks import BlockEmbedding, BlockLinear
from quickdraft.models.gguf_file import GGUFFile, TensorInfo

ARCHITECTURES = ("qwen2", "llama")
# GGUF tensor names -> transformers' (qwen2 and llama name their layers alike).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def runs_from_blocks(path: Path, kernel: BlockKernel | None) -> bool:
    """Whether ``load_gguf_blocks`` would hold the file's matrices as blocks: a supported family
    whose decoder matrices are mostly of types the kernel runs (a 4-bit or 8-bit file)."""
    file = GGUFFile(path)
    if kernel is None or file.architecture not in ARCHITECTURES:
        return False
    kinds = [t.kind.name for t in file.tensors.values() if len(t.shape) == 2]
    return sum(kind in BlockKernel.TYPES for kind in kinds) * 2 > len(kinds)


def block_types(path: Path) -> list[str]:
    """The ggml types of the file's matrices that the block kernel runs (``["Q4_K", "Q6_K"]``)."""
    kinds = {t.kind.name for t in GGUFFile(path).tensors.values() if len(t.shape) == 2}
    return sorted(kinds & BlockKernel.TYPES.keys())


def config_of(file: GGUFFile) -> PretrainedConfig:
    """The transformers config of a qwen2 or llama GGUF, from its metadata (as transformers'
    GGUF loader maps it, without decoding the tokenizer)."""
    arch, meta = file.architecture, file.metadata
    key = f"{arch}."
    heads = int(meta[key + "attention.head_count"])
    values = dict(
        vocab_size=int(file.tensors["token_embd.weight"].shape[1]),
        hidden_size=int(meta[key + "embedding_length"]),
        intermediate_size=int(meta[key + "feed_forward_length"]),
        num_hidden_layers=int(meta[key + "block_count"]),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(key + "attention.head_count_kv", heads)),
        max_position_embeddings=int(meta[key + "context_length"]),
        rms_norm_eps=float(meta[key + "attention.layer_norm_rms_epsilon"]),
        rope_parameters={"rope_theta": float(meta.get(key + "rope.freq_base", 10000.0)), "rope_type": "default"},
        tie_word_embeddings="output.weight" not in file.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    if arch == "llama":
        values["head_dim"] = int(meta.get(key + "attention.key_length", values["hidden_size"] // heads))
    return CONFIG_MAPPING[arch](**values)


def hf_name(name: str) -> str | None:
    """The transformers parameter name of GGUF tensor ``name``; ``None`` for one it has no place for."""
    match = _BLOCK.match(name)
    if match:
        layer, what, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[what]}.{kind}" if what in _LAYER_NAMES else None
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


def _row_order(name: str, rows: int, arch: str, heads: int, kv_heads: int) -> torch.Tensor | None:
    """The order to read a llama query or key matrix's rows in (llama.cpp's converter interleaved
    each head's two rotary halves; transformers' ``_reverse_permute_weights``), else ``None``."""
    if arch != "llama" or not re.search(r"\.attn_[qk]\.", name):
        return None
    n_head = heads if ".attn_q." in name else kv_heads
    order = torch.arange(rows).reshape(n_head, rows // n_head // 2, 2)
    return order.transpose(1, 2).reshape(rows)


def load_gguf_blocks(path: Path, kernel: BlockKernel) -> PreTrainedModel:
    """The model of the GGUF file at ``path``, its quantized matrices as blocks (module docstring).

    Raises:
        ValueError: the file's architecture is not one of ``ARCHITECTURES``, or a tensor has no
            place in the model.
    """
    file = GGUFFile(path)
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not run from its blocks ({', '.join(ARCHITECTURES)})")
    config = config_of(file)
    with no_init_weights():
        # The float32 tables replaced by blocks are never written: their pages cost nothing.
        module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    tied = "output.weight" not in file.tensors
    params = dict(module.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    with torch.no_grad():
        for tensor in file.tensors.values():
            target = hf_name(tensor.name)
            if target is None or target not in params:
                raise ValueError(f"{path}: tensor {tensor.name} has no place in a {type(module).__name__}")
            order = _row_order(tensor.name, int(tensor.shape[-1]), arch, heads, kv_heads)
            layer_name, _, what = target.rpartition(".")
            layer = module.get_submodule(layer_name)
            kind, width = tensor.kind.value, int(tensor.shape[0])
            if what == "weight" and isinstance(layer, (nn.Linear, nn.Embedding)) and kernel.row_bytes(kind, width):
                blocks = torch.from_numpy(np.array(file.data(tensor.name)))  # [rows, row_bytes], a copy
                if order is not None:
                    blocks = blocks[order]
                _put_blocks(module, layer_name, layer, blocks, kind, width, kernel)
                if tied and tensor.name == "token_embd.weight":
                    _put_blocks(module, "lm_head", module.lm_head, blocks, kind, width, kernel)
                    filled.add("lm_head.weight")
            else:
                values = torch.from_numpy(_dequantized(file, tensor)).reshape(params[target].shape)
                params[target].copy_(values if order is None else values[order])
            filled.add(target)
    missing = {name for name in params if name not in filled and not _replaced(module, name)}
    if missing:
        raise ValueError(f"{path}: no tensor for {sorted(missing)[:4]}")
    give_back_memory()
    return module.eval()


def _dequantized(file: GGUFFile, tensor: TensorInfo) -> np.ndarray:
    """A tensor of the file as float32 (norms, biases, and matrices of types the kernel lacks)."""
    data = file.data(tensor.name)
    if tensor.kind.name in ("F32", "F16"):
        return np.array(data.view(np.float32 if tensor.kind.name == "F32" else np.float16), dtype=np.float32)
    return np.asarray(gguf.quants.dequantize(np.array(data), tensor.kind), dtype=np.float32)


def _put_blocks(module: nn.Module, name: str, layer: nn.Module, blocks: torch.Tensor, kind: int, width: int,
                kernel: BlockKernel) -> None:
    """Replace linear layer or embedding ``name`` of ``module`` by one holding ``blocks``."""
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    if isinstance(layer, nn.Embedding):
        replacement: nn.Module = BlockEmbedding(blocks, kind, width, kernel)
    else:
        bias = layer.bias  # filled before or after: kept as a float32 buffer when the weight comes
        replacement = BlockLinear(blocks, kind, width, kernel, None if bias is None else bias.detach())
        if bias is not None:
            replacement.bias = bias.detach()  # the same storage: a bias read later lands in it
    setattr(parent, child, replacement)


def _replaced(module: nn.Module, name: str) -> bool:
    """Whether parameter ``name`` belonged to a layer now held as blocks."""
    layer_name = name.rpartition(".")[0]
    try:
        return isinstance(module.get_submodule(layer_name), (BlockLinear, BlockEmbedding))
    except AttributeError:
        return False


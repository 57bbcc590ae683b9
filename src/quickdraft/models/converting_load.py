"""Load safetensors stored in one dtype as another, holding one copy of the weights, not two.

transformers maps a safetensors file into memory and converts each tensor from the mapping:
every page of the file it touches counts in the process's resident memory until the file is
closed at the end. Loading the demo 1.5B target (stored in float32, 7.1 GB) in bfloat16 peaked
at 10.3 GB resident for 3.6 GB of weights, more than a float32 load (6.3 GB), which uses the
mapped pages as its tensors. Here the model is built empty in the wanted dtype and each stored
tensor is copied in on its own, its file opened and closed around it, so the peak is the
model plus one tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel
from torch import nn
from transformers.initialization import no_init_weights

from quickdraft.allocator import give_back_memory

_STORED_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
# Layers replaced between two hand-backs of their plain weights' memory (a decoder block has
# seven): the peak holds about this many plain layers more than the model.
GIVE_BACK_EVERY = 8


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's safetensors files (one, or the shards of an index); empty when it has none."""
    return sorted(folder.glob("*.safetensors"))


def stored_dtype(files: list[Path]) -> torch.dtype | None:
    """The floating-point dtype of the first file's tensors, read from its header (None: other)."""
    with open(files[0], "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    kinds = {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    floats = [_STORED_DTYPES[k] for k in kinds if k in _STORED_DTYPES]
    return floats[0] if len(floats) == 1 else None


def load_converted(folder: Path, config: PretrainedConfig, dtype: torch.dtype,
                   replace_linear: Callable[[nn.Module, str], None] | None = None) -> PreTrainedModel | None:
    """The model of ``config`` in ``dtype`` with the weights of ``folder``'s safetensors (of
    the same class, as ``save_pretrained`` writes them) and its generation config, or ``None``
    when their names do not match the model's (a checkpoint that needs transformers' own key
    conversions).

    ``replace_linear(parent, name)``: replaces each linear layer but the output layer (int8
    weights, ``quantize.linear_quantizer``; packed weights, ``packing.pack_linear``) as soon
    as its tensors are read, so that the model's plain weights are never all resident at once
    next to their replacements. The model's empty tensors cost nothing until written (untouched
    pages)."""
    files = safetensors_files(folder)
    with no_init_weights():
        module = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers())
    names = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            names.update(dict.fromkeys(handle.keys(), file))
    tied = {name for name in params if name not in names and _is_tied(module, name)}
    expected = {name for name, _ in module.named_parameters(remove_duplicate=False)} - tied
    if not expected <= names.keys() or not names.keys() <= params.keys():
        return None
    # A linear layer's parameter names, by the layer's name: it is replaced once all are read.
    pending = {layer: {f"{layer}.{p}" for p, _ in linear.named_parameters()}
               for layer, linear in module.named_modules()
               if replace_linear and type(linear) is nn.Linear and linear is not module.get_output_embeddings()}
    replaced = 0
    with torch.no_grad():
        for name, file in names.items():
            # One open per tensor: closing unmaps the pages just read, so they leave the
            # resident set instead of adding up to the whole file.
            with safe_open(file, framework="pt") as handle:
                params[name].copy_(handle.get_tensor(name))
            layer = name.rpartition(".")[0]
            if layer in pending:
                pending[layer].discard(name)
                if not pending[layer]:
                    parent, _, child = layer.rpartition(".")
                    replace_linear(module.get_submodule(parent), child)
                    for done in [n for n in params if n.rpartition(".")[0] == layer]:
                        del params[done]
                    replaced += 1
                    if replaced % GIVE_BACK_EVERY == 0:
                        # the replaced layers sit in reference cycles: freed only by the collector
                        give_back_memory()
    if replace_linear:
        give_back_memory()
    module.tie_weights()
    if (folder / "generation_config.json").is_file():  # end-of-sequence ids live there
        module.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return module.eval()


def _is_tied(module: PreTrainedModel, name: str) -> bool:
    """Whether parameter ``name`` is the output layer's weight tied to the input embedding's."""
    output = module.get_output_embeddings()
    return (output is not None and getattr(module.config, "tie_word_embeddings", False)
            and output.weight is module.get_input_embeddings().weight and name.endswith("weight")
            and any(p is output.weight for n, p in module.named_parameters(remove_duplicate=False) if n == name))

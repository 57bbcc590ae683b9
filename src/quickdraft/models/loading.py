"""``load_model``: a demo name, a folder, a GGUF file, a hub id in the local cache, or a model object.

quickdraft never downloads anything: every transformers call here passes ``local_files_only=True``.
Nothing global is changed (no ``HF_HUB_OFFLINE``), so the user's own environment keeps working.

How a string source is resolved, first match wins:

1. a demo model name (``DEMO_MODELS``): its GGUF kept in the quickdraft cache where it runs from
   its blocks, else converted once into a safetensors folder there;
2. a directory holding ``config.json`` and weights (safetensors or PyTorch ``.bin``);
3. a ``.gguf`` file (run from its own 4-bit or 8-bit blocks where the block kernel runs them,
   ``quickdraft.models.gguf_blocks``; else dequantized to dense layers when loaded);
4. a Hugging Face hub id whose files are already in the local hub cache.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import torch
from torch import nn
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    GgufConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from quickdraft.errors import InvalidParameterError, ModelNotFoundError, UnsupportedModelError
from quickdraft.hardware import machine_config
from quickdraft.models.base import LoadedModel
from quickdraft.models.converting_load import load_converted, safetensors_files, stored_dtype
from quickdraft.kernels import block_kernel
from quickdraft.models.demo import DEMO_INSTALL_HINT, DEMO_MODELS, demo_gguf_file, demo_model_dir
from quickdraft.models.gguf_blocks import block_types, load_gguf_blocks, runs_from_blocks
from quickdraft.models.gguf_file import GGUFFile
from quickdraft.models.packing import can_pack, pack_linear, pack_linear_layers
from quickdraft.models.quantize import check_quantization, linear_quantizer, quantize

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# Any one of these next to the weights means the folder carries a tokenizer.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")

_WHAT_IS_ACCEPTED = (
    "A model source is one of:\n"
    f"  - a demo model: {', '.join(DEMO_MODELS)}\n"
    f"    ({DEMO_INSTALL_HINT});\n"
    "  - a path to a directory holding config.json and the weights (*.safetensors), or to a .gguf file;\n"
    "  - a Hugging Face hub id (org/name) already in the local hub cache: quickdraft never downloads,\n"
    "    so fetch it first where there is network access (hf download org/name)."
)

TokenizerChoice = PreTrainedTokenizerBase | Literal["auto"] | None


@dataclass(frozen=True)
class WeightFiles:
    """Where a model's files are: a folder, and the GGUF file in it when the weights are one.

    Attributes:
        folder: a directory with ``config.json`` and weights, or the directory of the GGUF file.
        gguf_file: the GGUF file's name inside ``folder``; ``None`` for a config + weights folder.
    """

    folder: Path
    gguf_file: str | None = None


def load_model(
    source: str | os.PathLike[str] | PreTrainedModel,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    tokenizer: TokenizerChoice = "auto",
    quantization: str = "auto",
    pack_weights: bool | None = None,
) -> LoadedModel:
    """Load a causal language model for speculative decoding, offline.

    Args:
        source: a demo name (see ``DEMO_MODELS``), a directory with ``config.json`` and weights,
            a ``.gguf`` file, a hub id already in the local Hugging Face cache, or a
            ``PreTrainedModel`` object (moved to ``dtype`` and ``device`` in place, as
            ``Module.to`` does, its linear layers packed in place per ``pack_weights``, and
            named after its class).
        dtype: "auto" (the default): the dtype that decodes fastest on this machine
            (``quickdraft.hardware.machine_config``: float32 with int8 or int4 quantization, and
            for a model run from its GGUF blocks); or "float32" / "fp32", "bfloat16" / "bf16",
            or the matching ``torch.dtype``.
        device: "cpu", "cuda", "cuda:N" or a ``torch.device``.
        tokenizer: "auto" loads the tokenizer stored with the weights (``None`` when there is
            none, and always for a model object); ``None`` loads none; a tokenizer object is
            used as given.
        quantization: "auto" (the default): a GGUF file (or a demo model made from one) whose
            matrices are 4-bit or 8-bit blocks the block kernel runs (Q4_K_M, Q4_0, Q8_0) runs
            from those blocks, as the file holds them (``quickdraft.models.gguf_blocks``: the
            model llama.cpp runs, the output layer and embedding included), unless a dtype
            other than float32 is asked for; anything else keeps its stored weights, as
            "none". "int4" on such a GGUF runs its blocks too; on any other model, "int4" or
            "int8" re-quantize the decoder blocks' linear layers at load
            (``quickdraft.models.quantize``: a different model, meant for drafts; int8 about
            half the time of a bfloat16 draft step, int4 less again).
            Every quantized form needs ``dtype="float32"`` (the activations) on the CPU.
        pack_weights: for a float32 or bfloat16 model on a CPU, reorder the linear layers'
            weights once into oneDNN's layout, or for bfloat16 without native bfloat16
            instructions widen many-row products to float32 (``quickdraft.models.packing``):
            the same outputs (bit for bit on AVX-512 BF16, to the last bits elsewhere), faster
            on some CPUs, slower on others. ``None`` (the default) packs where this machine's
            probe found it faster for this dtype (``machine_config``); ``True`` packs wherever
            it can (float32: where torch runs oneDNN); ``False`` keeps the stock ``nn.Linear``
            layers (what transformers runs). Quantized drafts and GPU models are never packed.

    Returns:
        The model in eval mode on ``device``, with its tokenizer. ``torch.inference_mode`` is
        left to the caller.

    Raises:
        InvalidParameterError: unknown dtype, device or tokenizer argument, or CUDA asked for
            and not available.
        ModelNotFoundError: ``source`` resolves to nothing on this machine (the message lists
            what is accepted), or a demo model's packages are not installed.
        UnsupportedModelError: the model's cache cannot be rolled back (recurrent, linear
            attention, encoder-decoder) or it is not a causal language model.
        CorruptModelFileError: a demo model's assembled file fails its checksum.
    """
    torch_device = resolve_device(device)
    blocks = block_file(source, quantization, dtype, torch_device)
    if blocks is not None:
        return _load_blocks(source, blocks, dtype, tokenizer)
    if quantization == "auto":
        quantization = "none"
    if dtype == "auto":
        dtype = "float32" if quantization != "none" else machine_config(torch_device.type).dtype
    torch_dtype = resolve_dtype(dtype)
    _check_tokenizer_choice(tokenizer)
    check_quantization(quantization, torch_dtype, torch_device)
    pack = quantization == "none" and can_pack(torch_dtype, torch_device) and (
        pack_weights or (pack_weights is None and machine_config("cpu").packs(torch_dtype)))
    # Replaced as they are read, so that the plain weights and their replacements are never all
    # resident at once (the float32 demo target packed: 11.4 GB peak otherwise, for 6.6 GB).
    replace_linear = linear_quantizer(quantization) if quantization != "none" else pack_linear if pack else None
    if isinstance(source, PreTrainedModel):
        check_supported(source)
        module = source.to(device=torch_device, dtype=torch_dtype)
        given = None if isinstance(tokenizer, str) else tokenizer
        loaded = LoadedModel(module=module.eval(), tokenizer=given, name=type(source).__name__)
    else:
        files = resolve_source(source)
        module = _read_module(files, torch_dtype, replace_linear).to(torch_device)
        loaded_tokenizer = _read_tokenizer(files) if isinstance(tokenizer, str) else tokenizer
        loaded = LoadedModel(module=module.eval(), tokenizer=loaded_tokenizer, name=os.fspath(source))
    # The layers not replaced while reading (a model object, files loaded by transformers).
    if quantization != "none":
        return quantize(loaded, quantization)
    return pack_linear_layers(loaded) if pack else loaded


def block_file(source: object, quantization: str = "auto", dtype: str | torch.dtype = "auto",
               device: torch.device = torch.device("cpu")) -> Path | None:
    """The GGUF file that ``load_model(source, dtype, device, quantization)`` runs from its own
    blocks, or ``None``: another kind of source, a file the block kernel cannot run, no kernel
    here, a GPU, ``quantization`` "none" or "int8", or "auto" with a dtype other than float32
    asked for (the file is then dequantized to it, as before blocks ran)."""
    if quantization not in ("auto", "int4") or device.type != "cpu" or isinstance(source, PreTrainedModel):
        return None
    if quantization == "auto" and dtype != "auto" and resolve_dtype(dtype) != torch.float32:
        return None
    text = os.fspath(source)
    if text in DEMO_MODELS:
        return demo_gguf_file(text) if DEMO_MODELS[text].blocks and block_kernel() is not None else None
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf" and runs_from_blocks(path, block_kernel()):
        return path
    return None


def _load_blocks(source: object, path: Path, dtype: str | torch.dtype, tokenizer: TokenizerChoice) -> LoadedModel:
    """The model of GGUF file ``path`` run from its blocks (float32 activations, on the CPU)."""
    if dtype != "auto" and resolve_dtype(dtype) != torch.float32:
        raise InvalidParameterError(
            f"a model run from its GGUF blocks computes in float32 (got dtype={dtype!r}): use dtype='auto' or "
            "'float32', or quantization='none' to load the file dequantized"
        )
    _check_tokenizer_choice(tokenizer)
    kernel = block_kernel()
    assert kernel is not None, "block_file checks the kernel"
    module = load_gguf_blocks(path, kernel)
    check_supported(module)
    if isinstance(tokenizer, str):
        tokenizer = _gguf_tokenizer(path, kept=os.fspath(source) in DEMO_MODELS)
    return LoadedModel(module=module, tokenizer=tokenizer, name=os.fspath(source),
                       quantization="/".join(block_types(path)))


def _gguf_tokenizer(path: Path, kept: bool) -> PreTrainedTokenizerBase | None:
    """The tokenizer stored in GGUF file ``path`` (``None`` when it has none). ``kept``: save it
    beside the file (``<name>.tokenizer/``) and read that next time: transformers decodes a
    GGUF's 150k-token vocabulary in tens of seconds, a saved tokenizer in about one."""
    saved = path.with_suffix(".tokenizer")
    if kept and (saved / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(saved, local_files_only=True)
    if "tokenizer.ggml.tokens" not in GGUFFile(path).metadata:
        return None
    loaded = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if kept:
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tokenizer-"))
        loaded.save_pretrained(staging)
        try:
            os.replace(staging, saved)
        except OSError:  # saved meanwhile by another process
            shutil.rmtree(staging, ignore_errors=True)
    return loaded


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a name in ``DTYPES`` or one of its values; raises InvalidParameterError."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise InvalidParameterError(
        f"dtype {dtype!r} is not supported; choose 'auto' or one of {', '.join(DTYPES)} "
        "(or torch.float32 / torch.bfloat16)."
    )


def resolve_device(device: str | torch.device) -> torch.device:
    """A CPU or CUDA ``torch.device`` that exists here (``"auto"``: CUDA when there is one, else
    the CPU); raises InvalidParameterError otherwise."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise InvalidParameterError(
            f"device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise InvalidParameterError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'.")
    if not torch.cuda.is_available():
        raise InvalidParameterError(
            f"device {device!r} was asked for, but torch.cuda.is_available() is False: this torch "
            "build has no CUDA support or no GPU is visible. Use device='cpu'."
        )
    if resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise InvalidParameterError(
            f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)."
        )
    return resolved


def resolve_source(source: str | os.PathLike[str]) -> WeightFiles:
    """Where the files for ``source`` are: see the module docstring for the order of the lookups.

    Raises:
        ModelNotFoundError: nothing matches; the message says what would.
    """
    text = os.fspath(source)
    if text in DEMO_MODELS:
        return WeightFiles(demo_model_dir(text))
    path = Path(text).expanduser()
    if path.is_dir():
        return _folder_files(path)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{path} is a file but not a .gguf file. {_WHAT_IS_ACCEPTED}")
        return WeightFiles(path.parent, path.name)
    snapshot = _hub_snapshot(text)
    if snapshot is not None:
        return _folder_files(snapshot)
    close = difflib.get_close_matches(text, DEMO_MODELS, n=1)
    suggestion = f" Did you mean the demo model {close[0]!r}?" if close else ""
    raise ModelNotFoundError(f"Cannot find a model called {text!r}.{suggestion} {_WHAT_IS_ACCEPTED}")


def _folder_files(folder: Path) -> WeightFiles:
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"Directory {folder} has no config.json. {_WHAT_IS_ACCEPTED}")
    if not any(next(folder.glob(pattern), None) for pattern in _WEIGHT_PATTERNS):
        raise ModelNotFoundError(
            f"Directory {folder} has a config.json but no weights (*.safetensors or pytorch_model*.bin)."
        )
    return WeightFiles(folder)


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local hub-cache folder of ``repo_id``, or ``None`` when it is not cached (or not an id)."""
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None


def _check_tokenizer_choice(tokenizer: TokenizerChoice) -> None:
    if tokenizer is None or isinstance(tokenizer, PreTrainedTokenizerBase) or tokenizer == "auto":
        return
    raise InvalidParameterError(
        f"tokenizer must be 'auto', None or a transformers tokenizer, not {tokenizer!r}."
    )


def _read_config(files: WeightFiles) -> PretrainedConfig:
    return AutoConfig.from_pretrained(files.folder, gguf_file=files.gguf_file, local_files_only=True)


def _read_module(files: WeightFiles, dtype: torch.dtype,
                 replace_linear: Callable[[nn.Module, str], None] | None = None) -> PreTrainedModel:
    """The model in ``files``, checked for support before its weights are read (they can be GBs);
    ``replace_linear``: applied to its linear layers as they are read where the files allow
    (``load_converted``), else left to the caller."""
    config = _read_config(files)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise UnsupportedModelError(
            f"{files.folder}: model type {config.model_type!r} has no causal language model class in "
            "transformers; quickdraft needs a decoder-only model that predicts the next token."
        )
    _check_supported_config(config, config.model_type)
    stored = safetensors_files(files.folder) if files.gguf_file is None else []
    if stored and (replace_linear or stored_dtype(stored) not in (None, dtype)):
        module = load_converted(files.folder, config, dtype, replace_linear)
        if module is not None:
            check_supported(module)
            return module
    # A GGUF is dequantized into plain dense layers: speculation runs multi-token forwards on them.
    quantization = GgufConfig(dequantize=True) if files.gguf_file is not None else None
    module = AutoModelForCausalLM.from_pretrained(
        files.folder,
        gguf_file=files.gguf_file,
        quantization_config=quantization,
        dtype=dtype,
        local_files_only=True,
    )
    check_supported(module)
    return module


def _read_tokenizer(files: WeightFiles) -> PreTrainedTokenizerBase | None:
    """The tokenizer stored with the weights, or ``None`` when there is none."""
    if files.gguf_file is not None:
        reader = gguf.GGUFReader(files.folder / files.gguf_file)
        has_tokenizer = reader.get_field("tokenizer.ggml.tokens") is not None
    else:
        has_tokenizer = any((files.folder / name).is_file() for name in _TOKENIZER_FILES)
    if not has_tokenizer:
        return None
    return AutoTokenizer.from_pretrained(files.folder, gguf_file=files.gguf_file, local_files_only=True)


def check_supported(module: PreTrainedModel) -> None:
    """Raise UnsupportedModelError unless ``module`` is a causal LM whose KV cache can be rolled back.

    Speculative decoding appends draft tokens to the cache and then drops the rejected ones, so
    every layer's cache must be cut back exactly: recurrent states (Mamba, RWKV, linear
    attention, hybrids) cannot be, and encoder-decoder models are out of scope.
    """
    name = type(module).__name__
    if not isinstance(module, PreTrainedModel):
        raise UnsupportedModelError(f"{name} is not a transformers PreTrainedModel.")
    if not module.can_generate() or module.get_output_embeddings() is None:
        raise UnsupportedModelError(
            f"{name} is not a causal language model (no language-model head that generates); "
            "load it with its ...ForCausalLM class."
        )
    # transformers' own flag for models whose state cannot go back to an earlier prefix: its
    # assisted generation refuses them for the same reason.
    if type(module)._is_stateful or not type(module)._supports_default_dynamic_cache():
        raise UnsupportedModelError(
            f"{name} keeps a recurrent state instead of a per-token KV cache, so rejected draft "
            "tokens cannot be rolled back. Use an attention-only model."
        )
    _check_supported_config(module.config, name)


def _check_supported_config(config: PretrainedConfig, name: str) -> None:
    if config.is_encoder_decoder:
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model; quickdraft supports decoder-only causal language models."
        )
    if not DynamicCache(config=config).is_croppable:
        raise UnsupportedModelError(
            f"{name} has layers whose cache cannot be cropped (recurrent, convolutional or linear "
            "attention state), so rejected draft tokens cannot be rolled back. Use an attention-only model."
        )

"""The loaded-model record that the rest of quickdraft works with."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from quickdraft.models.int8_weights import unlisted_weight_count
from quickdraft.models.lean import LeanDecoder, lean_decoder


@dataclass(frozen=True)
class LoadedModel:
    """A causal language model ready for decoding, with its tokenizer when it has one.

    Attributes:
        module: the transformers model, in eval mode, on ``module.device``.
        tokenizer: its tokenizer, or ``None`` for models used with token ids only
            (tiny models built from a config in tests).
        name: what the user called it (demo name, path or class name), for messages and reports.
        quantization: "none", or "int8" or "int4" when its linear layers hold such weights
            (``quickdraft.models.quantize``), or the GGUF block types it runs from, e.g.
            "Q4_K/Q6_K" (``quickdraft.models.gguf_blocks``); ``dtype`` is then that of
            everything else.
    """

    module: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    name: str
    quantization: str = "none"

    @cached_property
    def lean(self) -> LeanDecoder | None:
        """The lean forward of its decoder (``quickdraft.models.lean``), ``None`` where it has none."""
        return lean_decoder(self.module.get_decoder())

    def forward_modules(self) -> list[torch.nn.Module]:
        """What a forward of this model may be called on: the model, its decoder (a runner
        computing part of the output layer calls that alone) and its lean forward if it has one."""
        return [self.module, self.module.get_decoder()] + ([self.lean] if self.lean is not None else [])

    @property
    def device(self) -> torch.device:
        return self.module.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.dtype

    @property
    def vocab_size(self) -> int:
        """Width of the logits the model produces (may exceed the tokenizer's size: padding)."""
        head = self.module.get_output_embeddings()
        # A head held as GGUF blocks has no weight tensor to measure (``models.blocks``).
        return int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt + generated) the model supports."""
        config = self.module.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(getattr(text_config, "max_position_embeddings", 2048))

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end generation, from the generation config, config and tokenizer."""
        ids: set[int] = set()
        for source in (getattr(self.module, "generation_config", None), self.module.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    def num_parameters(self) -> int:
        """Weights of the model, the quantized layers' included."""
        return sum(p.numel() for p in self.module.parameters()) + unlisted_weight_count(self.module)

    @property
    def precision(self) -> str:
        """The dtype, and the quantized weights if any: "bfloat16", "float32 + int4 weights"."""
        dtype = str(self.dtype).replace("torch.", "")
        return dtype if self.quantization == "none" else f"{dtype} + {self.quantization} weights"

"""The transformers peer: ``model.generate`` on the same model, dtype and threads.

It runs stock transformers layers, as its users do: where quickdraft packs a model's linear
layers (``models.packing``), the benchmark loads the peer's models again without packing.

Three flavours, as a user of transformers would run them: the target alone, assisted generation
with the draft model (``assistant_model``), and prompt lookup (``prompt_lookup_num_tokens``).

Token counts are made equal to quickdraft's: ``eos_token_id=None`` turns off transformers'
end-of-sequence handling (no stopping, no suppression), which is what ``ignore_eos=True`` does
in quickdraft, so both produce exactly ``max_new_tokens`` tokens and the same greedy tokens past
an end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from quickdraft.bench.generation import Generation
from quickdraft.config import SamplingParams
from quickdraft.models.base import LoadedModel

# Assisted generation reads these from the assistant's generation config, not from generate().
_ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@contextmanager
def _assistant_settings(assistant: LoadedModel, values: dict | None) -> Iterator[None]:
    """Set the assistant's generation config fields for one call, then put them back."""
    if not values:
        yield
        return
    config = assistant.module.generation_config
    saved = {name: getattr(config, name, None) for name in _ASSISTANT_FIELDS}
    for name, value in values.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


class TransformersMethod:
    """``target.module.generate(...)``, optionally with an assistant model or prompt lookup.

    Args:
        name, description: as in ``Method``.
        target: the model that generates.
        assistant: a draft model for assisted generation.
        fixed_k: with an assistant, draft exactly K tokens per step (constant schedule, no
            confidence stop); without it, transformers' defaults apply.
        prompt_lookup: prompt lookup with ``prompt_lookup_num_tokens=K``.
    """

    family = "transformers"

    def __init__(self, name: str, target: LoadedModel, description: str,
                 assistant: LoadedModel | None = None, fixed_k: bool = False,
                 prompt_lookup: bool = False) -> None:
        self.name = name
        self.target = target
        self.description = description
        self.assistant = assistant
        self.fixed_k = fixed_k
        self.prompt_lookup = prompt_lookup
        self.plain = assistant is None and not prompt_lookup

    def generate(self, prompt_ids: list[int], params: SamplingParams, k: int) -> Generation:
        device = self.target.device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, T]
        kwargs: dict = {
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": params.max_new_tokens,
            "eos_token_id": None,
            "pad_token_id": self._pad_token_id(),
        }
        if params.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
            # transformers samples from the global torch generator
            torch.manual_seed(params.seed if params.seed is not None else 0)
        assistant_values = None
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.module
            if self.fixed_k:
                assistant_values = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                                    "assistant_confidence_threshold": 0.0}
        if self.prompt_lookup:
            kwargs["prompt_lookup_num_tokens"] = k
        with torch.inference_mode(), _assistant_settings(self.assistant, assistant_values):
            output = self.target.module.generate(input_ids, **kwargs)  # [1, T + N]
        new = output[0, len(prompt_ids):].tolist()
        if len(new) != params.max_new_tokens:
            raise RuntimeError(
                f"{self.name}: transformers produced {len(new)} tokens, not {params.max_new_tokens}: "
                "the token counts would not be comparable"
            )
        return Generation(new)

    def _pad_token_id(self) -> int:
        # Batch size 1 never pads, but generate() warns when it has no pad id to fall back on.
        for source in (self.target.module.generation_config, self.target.module.config):
            value = getattr(source, "pad_token_id", None)
            if isinstance(value, int):
                return value
        return 0

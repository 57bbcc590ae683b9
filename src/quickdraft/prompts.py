"""Prompt construction shared by the CLI, the server and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from quickdraft.errors import InvalidParameterError


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase | None, messages: Sequence[dict]) -> list[int]:
    """Token ids of ``messages`` (``[{"role": ..., "content": ...}]``) through the chat template,
    ending with the assistant's turn opened (``add_generation_prompt``)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise InvalidParameterError(
            "this model's tokenizer has no chat template: send a plain prompt instead"
        )
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    # The template already holds the special tokens it needs; adding BOS again would change it.
    return tokenizer(text, add_special_tokens=False)["input_ids"]

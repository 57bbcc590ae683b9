"""The EAGLE head: one decoder layer of the target's own architecture that predicts its next feature.

EAGLE (Li et al. 2024, arXiv:2401.15077; EAGLE-2, arXiv:2406.16858) drafts at the level of
features. Word used throughout: the **feature** ``f_i`` of position ``i`` is the target's
last-layer hidden state there, after the final norm, so that the target's logits at ``i`` are
``lm_head(f_i)``: ``f_i`` predicts token ``x_{i+1}``.

Position ``i`` of the head reads token ``x_{i+1}`` and feature ``f_i`` and predicts ``f_{i+1}``::

    input_i     = fc(concat(embed(x_{i+1}), f_i))          # [2H] -> [H]
    f^_{i+1}    = decoder(input_0 .. input_i)[i]            # one layer, causal attention
    q(x_{i+2})  = softmax(lm_head(f^_{i+1}))                # after the sampling parameters

``embed`` and ``lm_head`` are the target's own, frozen and not stored with the head; ``fc``, the
layer and its norms are what training learns. Worked example: the sequence ``a b c d`` with the
target's features ``f_a f_b f_c`` (``d`` has not been through the target yet). The head feeds
``(b, f_a) (c, f_b) (d, f_c)``; its last output ``f^_d`` gives the first draft ``x1``; then
``(x1, f^_d)`` gives ``f^_x1`` and the second draft ``x2``, and so on: drafted positions read the
head's own predicted features until the target's real ones replace them after verification.

A checkpoint is a folder (``head_checkpoint``): ``head.safetensors`` (``fc.*`` and
``decoder.*``, float32) and ``config.json`` (kind ``eagle``, the decoder's transformers config,
the vocabulary size trained on, the target's identity and the training record). See
docs/trained_drafters.md.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig

from quickdraft.drafters.head_checkpoint import WEIGHTS_FILE, checked_head_config
from quickdraft.models.base import LoadedModel


def head_decoder_config(target_config: PretrainedConfig, intermediate_size: int | None = None) -> PretrainedConfig:
    """The target's config cut to one decoder layer, for the head's decoder.

    ``intermediate_size`` is the width of the layer's MLP; ``None``: 4/3 of the hidden size, or
    the target's own width where that is narrower. For the demo target that is 2,048 instead of
    8,960: a third of the parameters, and at equal training time a head that agrees more with
    the target (docs/trained_drafters.md).

    ``vocab_size=1``: the decoder's own embedding is a single row that is never used (the head
    embeds with the target's embedding and passes ``inputs_embeds``), so it costs nothing; the
    special token ids go with it (they would point outside that one-row vocabulary).
    """
    values = target_config.get_text_config().to_dict()
    for key in ("quantization_config", "layer_types", "_name_or_path", "architectures"):
        values.pop(key, None)  # layer_types is derived again for one layer
    values.update(num_hidden_layers=1, vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    values["intermediate_size"] = intermediate_size or min(values["intermediate_size"], 4 * values["hidden_size"] // 3)
    return AutoConfig.for_model(**values)


class EagleHead(nn.Module):
    """``fc`` ([2H] -> [H]) and a one-layer decoder of the target's architecture.

    Args:
        config: the decoder's config (``head_decoder_config`` of the target's).
        vocabulary_size: the most frequent token ids the head was trained (and drafts) over;
            ``None`` for the whole vocabulary.
    """

    kind = "eagle"

    def __init__(self, config: PretrainedConfig, vocabulary_size: int | None = None) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.vocabulary_size = vocabulary_size
        self.fc = nn.Linear(2 * hidden, hidden)
        self.decoder = AutoModel.from_config(config, attn_implementation="sdpa")

    def forward(
        self,
        embeddings: torch.Tensor,
        features: torch.Tensor,
        cache=None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted next features.

        Args:
            embeddings: ``[B, T, H]`` the target's embedding of ``x_{i+1}`` at each position i.
            features: ``[B, T, H]`` ``f_i``: the target's features, or the head's own
                predictions at drafted positions.
            cache: the head's ``DynamicCache`` when decoding (``None`` in training).
            position_ids: ``[B, T]``; default ``0 .. T - 1`` after what the cache holds.
            attention_mask: ``[B, 1, T, cached + T]`` additive mask (trees); default causal.

        Returns:
            ``[B, T, H]`` ``f^_{i+1}`` at each position.
        """
        assert embeddings.dim() == 3 and embeddings.shape == features.shape, (embeddings.shape, features.shape)
        inputs = self.fc(torch.cat([embeddings, features], dim=-1))  # [B, T, H]
        out = self.decoder(inputs_embeds=inputs, cache=cache, use_cache=cache is not None,
                           position_ids=position_ids, attention_mask=attention_mask)
        return out.last_hidden_state  # [B, T, H]

    def checkpoint_fields(self) -> dict:
        """What ``config.json`` needs to build the head again."""
        return {"decoder_config": self.config.to_dict()}


def load_eagle_head(folder: str | Path, target: LoadedModel) -> EagleHead:
    """The head saved in ``folder``, checked against ``target``, on its device and in its dtype."""
    folder = Path(folder).expanduser()  # "eagle:~/..." reaches us unexpanded by the shell
    config = checked_head_config(folder, target, EagleHead.kind)
    head = EagleHead(AutoConfig.for_model(**config["decoder_config"]), config["vocabulary_size"])
    head.load_state_dict(load_file(folder / WEIGHTS_FILE))
    return head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)

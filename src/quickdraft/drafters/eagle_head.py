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

A checkpoint is a folder: ``head.safetensors`` (``fc.*`` and ``decoder.*``, float32) and
``config.json`` (format, the decoder's transformers config, the vocabulary size trained on,
the target's identity and the training record). See docs/trained_drafters.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig

from quickdraft.errors import CheckpointMismatchError, ModelNotFoundError, UnsupportedModelError
from quickdraft.models.base import LoadedModel

FORMAT = "quickdraft-eagle"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"


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


def target_identity(target: LoadedModel) -> dict:
    """What a head checkpoint records about its target, to refuse being used with another one.

    The tokenizer's hash (its vocabulary), the shapes the head depends on, and a hash of a few
    rows of the target's embedding and output layer rounded to bfloat16, so that the same
    weights loaded in float32 or bfloat16 agree while any other model differs.
    """
    module = target.module
    vocabulary = None
    if target.tokenizer is not None:
        items = sorted(target.tokenizer.get_vocab().items())
        vocabulary = hashlib.sha256(json.dumps(items).encode()).hexdigest()
    weights = hashlib.sha256()
    for matrix in (module.get_input_embeddings().weight, module.get_output_embeddings().weight):
        rows = torch.cat([matrix[:8], matrix[-8:]]).detach().to("cpu", torch.bfloat16)
        weights.update(rows.contiguous().view(torch.int16).numpy().tobytes())
    config = module.config.get_text_config()
    return {
        "name": target.name,
        "model_type": config.model_type,
        "hidden_size": int(config.hidden_size),
        "vocab_size": target.vocab_size,
        "tokenizer_sha256": vocabulary,
        "weights_sha256": weights.hexdigest(),
    }


def save_eagle_head(head: EagleHead, target: LoadedModel, folder: str | Path, training: dict) -> None:
    """Write ``head`` for ``target`` into ``folder`` (each file replaced atomically)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().to("cpu", torch.float32).contiguous() for name, value in head.state_dict().items()}
    save_file(tensors, folder / f"{WEIGHTS_FILE}.tmp")
    os.replace(folder / f"{WEIGHTS_FILE}.tmp", folder / WEIGHTS_FILE)
    config = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "eagle",
        "target": target_identity(target),
        "vocabulary_size": head.vocabulary_size,
        "decoder_config": head.config.to_dict(),
        "training": training,
    }
    (folder / f"{CONFIG_FILE}.tmp").write_text(json.dumps(config, indent=1), encoding="utf-8")
    os.replace(folder / f"{CONFIG_FILE}.tmp", folder / CONFIG_FILE)


def read_head_config(folder: str | Path) -> dict:
    """The ``config.json`` of a head checkpoint; raises ``ModelNotFoundError`` if there is none."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file() or not (Path(folder) / WEIGHTS_FILE).is_file():
        raise ModelNotFoundError(
            f"{folder} is not a trained drafter: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
            "(write one with quickdraft train-drafter --out DIR)"
        )
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise ModelNotFoundError(
            f"{path} is not a {FORMAT} version {VERSION} checkpoint "
            f"(format {config.get('format')!r}, version {config.get('version')!r})"
        )
    return config


def check_head_target(config: dict, target: LoadedModel, folder: str | Path) -> None:
    """Raise ``CheckpointMismatchError`` unless the head in ``folder`` was trained for ``target``."""
    trained, given = config["target"], target_identity(target)
    differences = [key for key in ("tokenizer_sha256", "hidden_size", "vocab_size", "weights_sha256")
                   if trained.get(key) != given[key]]
    if differences:
        raise CheckpointMismatchError(
            f"the drafter in {folder} was trained for the target {trained.get('name')!r} "
            f"({trained.get('model_type')}, hidden size {trained.get('hidden_size')}), not for "
            f"{target.name!r} ({given['model_type']}, hidden size {given['hidden_size']}): "
            f"{', '.join(differences)} differ. An EAGLE head drafts from its own target's features "
            f"and reuses its embedding and output layer; train one for this target with "
            f"quickdraft train-drafter --target {target.name} --out DIR"
        )


def load_eagle_head(folder: str | Path, target: LoadedModel) -> EagleHead:
    """The head saved in ``folder``, checked against ``target``, on its device and in its dtype."""
    text_config = target.module.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None) or getattr(text_config, "logit_scale", None):
        # The head and the feature-keeping runner compute logits as lm_head(feature); a model
        # that transforms them after the output layer would no longer match plain decoding.
        raise UnsupportedModelError(
            f"{target.name}: its logits are rescaled after the output layer (softcapping or a logit "
            "scale), which EAGLE drafting does not reproduce; use a draft model or ngram"
        )
    folder = Path(folder).expanduser()  # "eagle:~/..." reaches us unexpanded by the shell
    config = read_head_config(folder)
    check_head_target(config, target, folder)
    head = EagleHead(AutoConfig.for_model(**config["decoder_config"]), config["vocabulary_size"])
    head.load_state_dict(load_file(folder / WEIGHTS_FILE))
    return head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)

"""Trained-head checkpoints (EAGLE, Medusa): writing them, and refusing one made for another target.

A checkpoint is a folder: ``head.safetensors`` (the head's own weights, float32) and
``config.json``: format and version, the ``kind`` of head, the target's identity
(``target_identity``), the vocabulary size trained on, what the kind needs to build the head
(``checkpoint_fields``) and the training record. See docs/trained_drafters.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from quickdraft.errors import CheckpointMismatchError, ModelNotFoundError, UnsupportedModelError
from quickdraft.models.base import LoadedModel

FORMAT = "quickdraft-eagle"  # the first kind's name; kept so that earlier checkpoints still load
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"


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


def save_head(head: nn.Module, target: LoadedModel, folder: str | Path, training: dict) -> None:
    """Write a trained head for ``target`` into ``folder`` (each file replaced atomically).

    ``head`` has a ``kind`` (``"eagle"``, ``"medusa"``), a ``vocabulary_size`` and
    ``checkpoint_fields()``: what its loader needs to build it again.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().to("cpu", torch.float32).contiguous() for name, value in head.state_dict().items()}
    save_file(tensors, folder / f"{WEIGHTS_FILE}.tmp")
    os.replace(folder / f"{WEIGHTS_FILE}.tmp", folder / WEIGHTS_FILE)
    config = {
        "format": FORMAT,
        "version": VERSION,
        "kind": head.kind,
        "target": target_identity(target),
        "vocabulary_size": head.vocabulary_size,
        **head.checkpoint_fields(),
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
            f"{', '.join(differences)} differ. A trained head drafts from its own target's features "
            f"and reuses its output layer; train one for this target with "
            f"quickdraft train-drafter --target {target.name} --kind {config.get('kind', 'eagle')} --out DIR"
        )


def checked_head_config(folder: Path, target: LoadedModel, kind: str) -> dict:
    """The ``config.json`` of the ``kind`` head in ``folder``, after checking that it is one and
    that it was trained for ``target``, and that ``target``'s logits are its output layer's."""
    text_config = target.module.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None) or getattr(text_config, "logit_scale", None):
        # The head and the feature-keeping runner compute logits as lm_head(feature); a model
        # that transforms them after the output layer would no longer match plain decoding.
        raise UnsupportedModelError(
            f"{target.name}: its logits are rescaled after the output layer (softcapping or a logit "
            "scale), which drafting from its features does not reproduce; use a draft model or ngram"
        )
    config = read_head_config(folder)
    found = config.get("kind", "eagle")
    if found != kind:
        raise ModelNotFoundError(
            f"{folder} holds a head of kind {found!r}, not {kind!r}: use it as --draft {found}:{folder}"
        )
    check_head_target(config, target, folder)
    return config

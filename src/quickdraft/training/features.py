"""Collecting the target's features over the training chunks, in shards that survive interruption.

Layout under the output folder::

    data/target.json                 the target's identity (head_checkpoint.target_identity)
    data/tokens.safetensors          "tokens": [N, T] int64, the packed training chunks
    data/features-00000.safetensors  "features": [n, T, H] the target's features of chunks 0 .. n-1
    data/features-00001.safetensors  ... one shard per ``chunks_per_shard`` chunks

A shard is written to a temporary name and renamed, so a shard on disk is always complete; a
rerun with the same target and chunks skips the shards it finds and collects the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from quickdraft.drafters.head_checkpoint import target_identity
from quickdraft.errors import CheckpointMismatchError
from quickdraft.models.base import LoadedModel

SHARD_TOKENS = 8192  # about 25 MB of bfloat16 features at H = 1536


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def store_tokens(target: LoadedModel, tokens: torch.Tensor, folder: Path) -> None:
    """Record the chunks and the target in ``folder/data``, or check that they match a previous run's."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    identity = target_identity(target)
    if (data / "tokens.safetensors").is_file():
        previous = json.loads((data / "target.json").read_text(encoding="utf-8"))
        same_target = {k: v for k, v in previous.items() if k != "name"} == {
            k: v for k, v in identity.items() if k != "name"}
        if not same_target or not torch.equal(load_file(data / "tokens.safetensors")["tokens"], tokens):
            what = "another target" if not same_target else "other data or settings (sources, --tokens, --seq-len)"
            raise CheckpointMismatchError(
                f"{folder} holds a run for {what}; resume it with the same --target, --data, "
                f"--tokens and --seq-len, or give a new --out folder"
            )
        return
    _save_atomic({"tokens": tokens}, data / "tokens.safetensors")
    (data / "target.json").write_text(json.dumps(identity, indent=1), encoding="utf-8")


@torch.inference_mode()
def collect_features(
    target: LoadedModel,
    tokens: torch.Tensor,
    folder: Path,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> torch.Tensor:
    """The target's features of every chunk (``[N, T, H]``, the target's dtype, on the CPU).

    Runs the target's decoder (no output layer) on each ``[T]`` chunk from position 0; shards
    already on disk are loaded instead of computed.
    """
    n, seq_len = tokens.shape
    per_shard = max(1, SHARD_TOKENS // seq_len)
    shards = [folder / "data" / f"features-{s:05d}.safetensors" for s in range((n + per_shard - 1) // per_shard)]
    done = sum(path.is_file() for path in shards)
    if done:
        log(f"found {done} of {len(shards)} feature shards in {folder / 'data'}; collecting the rest")
    decoder = target.module.get_decoder()
    bar = tqdm(total=n * seq_len, unit="tok", desc="target features", disable=not progress, smoothing=0.1)
    parts = []
    for s, path in enumerate(shards):
        chunks = tokens[s * per_shard : (s + 1) * per_shard]  # [n, T]
        if path.is_file():
            bar.update(chunks.numel())
        else:
            rows = []
            for chunk in chunks:
                rows.append(decoder(input_ids=chunk[None].to(target.device)).last_hidden_state[0].cpu())  # [T, H]
                bar.update(seq_len)
            _save_atomic({"features": torch.stack(rows)}, path)
        parts.append(load_file(path)["features"])
    bar.close()
    return torch.cat(parts)  # [N, T, H]

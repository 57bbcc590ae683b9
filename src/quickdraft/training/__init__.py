"""``quickdraft train-drafter``: train an EAGLE or Medusa head for a target (docs/trained_drafters.md).

Three resumable phases, each leaving its work in the output folder: pack the training text
into chunks (``data``), collect the target's features over them (``features``), train the head
on those features (``trainer``). Like ``bench/``, this is a tool on top of the library: the
decoding library only reads the checkpoint it writes (``quickdraft.drafters.eagle_head``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from quickdraft.models.base import LoadedModel
from quickdraft.training.data import Document, pack_chunks
from quickdraft.training.features import collect_features, store_tokens
from quickdraft.training.trainer import TrainConfig, train_head

__all__ = ["TrainConfig", "train_drafter"]


def train_drafter(
    target: LoadedModel,
    sources: Sequence[Iterable[Document]],
    folder: str | Path,
    config: TrainConfig = TrainConfig(),
    progress: bool = True,
    log: Callable[[str], None] = print,
    record: dict | None = None,
) -> dict:
    """Train a head (``config.kind``) for ``target`` into ``folder``, or resume an interrupted run there.

    Args:
        sources: the training documents (token ids) of each source; chunks are taken from the
            sources in turn (``data.pack_chunks``).
        record: what to write down about the data in the checkpoint's config (source names).

    Returns:
        The training record: data sizes, settings and the loss and top-1 agreement per epoch.
    """
    folder = Path(folder).expanduser()
    tokens = pack_chunks(sources, config.seq_len, config.tokens)  # [N, T]
    if tokens.numel() < config.tokens - config.seq_len:
        log(f"the data holds {tokens.numel():,} tokens in chunks of {config.seq_len}, fewer than --tokens "
            f"{config.tokens:,}: training on those")
    store_tokens(target, tokens, folder)
    features = collect_features(target, tokens, folder, progress, log)  # [N, T, H]
    return train_head(target, tokens, features, folder, config, progress, log,
                      {**(record or {}), "tokens": tokens.numel()})

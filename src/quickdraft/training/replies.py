"""Self-distillation text: the target's own greedy replies to training-split prompts, cached.

A head drafts the target's replies, so the target's replies are the text closest to what it
must learn (docs/trained_drafters.md measured 0.44 first-token agreement on them for a head
trained on prompts and code). ``train-drafter --data self:humaneval,self:spec-bench`` asks the
target for them here: each document is a prompt (through the chat template, as the benchmark
sends it) followed by the target's greedy reply, up to its end token or ``max_new_tokens``.

Replies are generated in batches with left padding (``transformers``' ``generate``): for
throughput, not latency, a batch of 8 on the 2-core CPU gives 2.5x the tokens a second of one
sequence. Batches are formed from prompts of similar length, so little is spent on padding.

Layout: ``data/replies-<source>.jsonl`` under the output folder, one line per prompt
(``{"id": ..., "ids": [...]}``, prompt and reply token ids), rewritten whole (temporary name,
then rename) after each batch: a rerun reads the replies it finds and generates the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from quickdraft.bench.workloads import Prompt, prompt_ids
from quickdraft.errors import InvalidParameterError
from quickdraft.models.base import LoadedModel
from quickdraft.training.data import Document, training_prompts

SELF_PREFIX = "self:"
_PROMPT_SOURCES = ("humaneval", "spec-bench")


def check_self_source(name: str, prompts: int, max_new_tokens: int) -> str:
    """The prompt set a ``self:`` source names; raises ``InvalidParameterError`` for an unknown
    one or a count below 1 (checked before the target is loaded)."""
    source = name.removeprefix(SELF_PREFIX)
    if prompts < 1 or max_new_tokens < 1:
        raise InvalidParameterError(f"need --reply-prompts and --reply-tokens >= 1, got {prompts} and {max_new_tokens}")
    if source not in _PROMPT_SOURCES:
        raise InvalidParameterError(
            f"unknown self-distillation source {name!r}: give {' or '.join(SELF_PREFIX + s for s in _PROMPT_SOURCES)}")
    return source


def self_source(
    name: str, target: LoadedModel, folder: str | Path, prompts: int, max_new_tokens: int, progress: bool = True,
) -> Iterator[Document]:
    """The documents of the ``--data`` source ``self:humaneval`` or ``self:spec-bench``: the
    target's replies to the first ``prompts`` of that training split, cached under ``folder``."""
    source = check_self_source(name, prompts, max_new_tokens)
    path = Path(folder).expanduser() / "data" / f"replies-{source}.jsonl"
    return reply_documents(target, reply_prompts(source, prompts), path, max_new_tokens, progress=progress)


def reply_prompts(source: str, count: int) -> list[Prompt]:
    """The first ``count`` training-split prompts of ``source`` (``"humaneval"`` or
    ``"spec-bench"``), taken from its categories in turn so that a few cover all of them."""
    by_category: dict[str, list[Prompt]] = {}
    for prompt in training_prompts(source):
        by_category.setdefault(prompt.category, []).append(prompt)
    rounds = max(len(prompts) for prompts in by_category.values())
    interleaved = [prompts[i] for i in range(rounds) for prompts in by_category.values() if i < len(prompts)]
    return interleaved[:count]


def _end_tokens(target: LoadedModel) -> set[int]:
    """Token ids that end a reply: the generation config's end tokens, or the tokenizer's."""
    ends = getattr(target.module.generation_config, "eos_token_id", None)
    if ends is None and target.tokenizer is not None:
        ends = target.tokenizer.eos_token_id
    return set() if ends is None else {ends} if isinstance(ends, int) else set(ends)


@torch.inference_mode()
def _generate(target: LoadedModel, prompts: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The greedy replies to ``prompts`` in one left-padded batch, each cut after its end token."""
    ends = _end_tokens(target)
    pad = min(ends) if ends else 0  # any id: padding is masked out
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=target.device)  # [B, W]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)  # [B, W]
    out = target.module.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=sorted(ends) or None, pad_token_id=pad)  # [B, W + new]
    replies = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, token in enumerate(row) if token in ends), len(row))
        replies.append(row[:cut])
    return replies


def reply_documents(
    target: LoadedModel,
    prompts: Sequence[Prompt],
    path: Path,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    progress: bool = True,
) -> Iterator[Document]:
    """Each prompt's token ids followed by the target's greedy reply, generated or read from ``path``.

    Documents come in the order of the prompts sorted by length (then by id), the order in
    which they are generated, so that a rerun packs the same chunks.
    """
    done: dict[str, list[int]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = row["ids"]
    encoded = sorted(((prompt_ids(p, target.tokenizer, chat=True), p.id) for p in prompts),
                     key=lambda item: (len(item[0]), item[1]))  # [(ids, id)]
    missing = [item for item in encoded if item[1] not in done]
    bar = tqdm(total=len(missing), unit="reply", desc=f"target replies ({path.stem})",
               disable=not progress or not missing)
    path.parent.mkdir(parents=True, exist_ok=True)
    for ids, prompt_id in encoded:
        if prompt_id not in done:
            batch = missing[:batch_size]
            del missing[:batch_size]
            replies = _generate(target, [b[0] for b in batch], max_new_tokens)
            done.update((i, p + r) for (p, i), r in zip(batch, replies))
            temporary = path.with_suffix(".tmp")
            temporary.write_text("".join(json.dumps({"id": i, "ids": ids}) + "\n" for i, ids in done.items()),
                                 encoding="utf-8")
            os.replace(temporary, path)
            bar.update(len(batch))
        yield done[prompt_id]
    bar.close()

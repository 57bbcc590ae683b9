"""Training text for trained drafters, kept apart from the benchmark's prompts.

The benchmark (``quickdraft.bench.workloads``) decodes the **first** N prompts of each category
(3 by default). Training reads only what comes after a fixed held-out head of each file:

* ``humaneval``: HumanEval problems from index ``HUMANEVAL_HELD_OUT`` (40) on: 124 of 164.
* ``spec-bench``: Spec-Bench questions from the ``SPEC_BENCH_HELD_OUT``-th (10) of their
  Spec-Bench category on: 70 each of translation, summarization, qa, math_reasoning and rag
  (350). The eight MT-Bench kinds have 10 questions each, so all of MT-Bench is held out.
* ``stdlib``: the Python standard library's own source files (``Path(os.__file__).parent``,
  ``*.py``, without ``site-packages`` and test folders), in a fixed shuffled order.
* a path: a text file, a ``.jsonl`` file (each line's ``"text"``, ``"prompt"`` or first of
  ``"turns"``), or a folder (its ``*.py``, ``*.txt`` and ``*.md`` files, sorted).

Any benchmark run with up to 10 prompts per category (40 for ``code``) therefore decodes no
training prompt. Benchmark-style prompts go through the chat template (as ``quickdraft bench``
sends them) when the tokenizer has one; the other text is tokenized as is.

This module belongs to the ``train-drafter`` tool, like ``bench/``: it reads the bundled
prompts through ``quickdraft.bench.workloads``; the library never imports it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.bench.workloads import CODE_INSTRUCTION, Prompt, humaneval_problems, prompt_ids, spec_bench_questions
from quickdraft.errors import InvalidParameterError

HUMANEVAL_HELD_OUT = 40
SPEC_BENCH_HELD_OUT = 10
BUNDLED = ("stdlib", "humaneval", "spec-bench")
DEFAULT_SOURCES = BUNDLED
_TEXT_SUFFIXES = (".py", ".txt", ".md")
_SKIPPED_FOLDERS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}

Document = Sequence[int]


def training_prompts(source: str) -> list[Prompt]:
    """The training split of a bundled prompt set: ``"humaneval"`` or ``"spec-bench"``."""
    if source == "humaneval":
        return [Prompt(id=f"humaneval/{p['task_id']}", category="code", text=p["prompt"],
                       chat_text=CODE_INSTRUCTION.format(prompt=p["prompt"]))
                for p in humaneval_problems()[HUMANEVAL_HELD_OUT:]]
    seen: dict[str, int] = {}
    prompts = []
    for q in spec_bench_questions():
        index = seen[q["category"]] = seen.get(q["category"], -1) + 1
        if index >= SPEC_BENCH_HELD_OUT:
            prompts.append(Prompt(id=f"spec_bench/{q['question_id']}", category=q["category"], text=q["turns"][0]))
    return prompts


def stdlib_files() -> list[Path]:
    """The standard library's ``*.py`` files, shuffled with a fixed seed (so that a small token
    budget still samples many modules, the same ones on every run)."""
    root = Path(os.__file__).parent
    files = sorted(f for f in root.rglob("*.py") if not _SKIPPED_FOLDERS & set(f.relative_to(root).parts))
    random.Random(0).shuffle(files)
    return files


def _path_texts(path: Path) -> Iterator[str]:
    if path.is_dir():
        for file in sorted(f for f in path.rglob("*") if f.suffix in _TEXT_SUFFIXES and f.is_file()):
            yield file.read_text(encoding="utf-8", errors="replace")
    elif path.suffix == ".jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                yield str(row.get("text") or row.get("prompt") or row["turns"][0])
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def source_documents(source: str, tokenizer: PreTrainedTokenizerBase) -> Iterator[Document]:
    """Token ids of each document of one source (a bundled name or a path), lazily."""
    if source in ("humaneval", "spec-bench"):
        for prompt in training_prompts(source):
            yield prompt_ids(prompt, tokenizer, chat=True)
        return
    if source == "stdlib":
        texts: Iterable[str] = (f.read_text(encoding="utf-8", errors="replace") for f in stdlib_files())
    else:
        path = Path(source)
        if not path.exists():
            raise InvalidParameterError(
                f"unknown data source {source!r}: give {', '.join(BUNDLED)}, a text or .jsonl file, or a folder"
            )
        texts = _path_texts(path)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for text in texts:
        if text.strip():
            yield tokenizer(text, add_special_tokens=False)["input_ids"] + eos  # eos: documents are packed


def pack_chunks(sources: Sequence[Iterable[Document]], seq_len: int, tokens: int) -> torch.Tensor:
    """``[N, seq_len]`` int64 chunks, ``N = tokens // seq_len`` at most, taken round-robin.

    Each source's documents are concatenated and cut into ``seq_len``-token chunks; chunks are
    taken one per source in turn, so that every source is represented whatever the budget,
    until ``tokens`` are taken or every source is used up (a last partial chunk is dropped).
    """
    if seq_len < 2 or tokens < seq_len:
        raise InvalidParameterError(f"need seq_len >= 2 and tokens >= seq_len, got {seq_len} and {tokens}")
    streams = [_chunks(iter(documents), seq_len) for documents in sources]
    chunks: list[list[int]] = []
    while streams and len(chunks) < tokens // seq_len:
        for stream in list(streams):
            chunk = next(stream, None)
            if chunk is None:
                streams.remove(stream)
            elif len(chunks) < tokens // seq_len:
                chunks.append(chunk)
    if not chunks:
        raise InvalidParameterError(f"the data holds fewer than seq_len = {seq_len} tokens")
    return torch.tensor(chunks, dtype=torch.long)


def _chunks(documents: Iterator[Document], seq_len: int) -> Iterator[list[int]]:
    buffer: list[int] = []
    for document in documents:
        buffer.extend(int(t) for t in document)
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            del buffer[:seq_len]

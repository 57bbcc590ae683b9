"""Benchmark prompts: Spec-Bench categories, HumanEval, or the user's own JSONL file.

Categories (``CATEGORIES``):

* ``mt_bench``: Spec-Bench's multi-turn conversations (8 MT-Bench kinds: writing, roleplay,
  reasoning, math, coding, extraction, stem, humanities). Prompts are taken round-robin over
  the kinds. Only the **first turn** is decoded: Spec-Bench's second turn continues each
  method's own first answer, which would give the methods different contexts to decode.
  A kind's name (``writing``, ...) also works as a category of its own.
* ``translation``, ``summarization``, ``qa``, ``math_reasoning``, ``rag``: Spec-Bench's
  single-turn categories, first prompts in file order.
* ``code``: HumanEval function signatures and docstrings, first problems in file order.
* ``code_edit`` (not in the default set): a whole HumanEval function (its solution included) to
  return with type hints, the loadgen's ``code-edit`` workload: most of the answer repeats the
  request.

Structured extraction (``extraction_requests``, for ``quickdraft.bench.structured`` and the
loadgen's ``extraction`` workload): a news passage to fill a fixed JSON schema.

A prompt is text; ``prompt_ids`` turns it into token ids, through the chat template or not.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from itertools import zip_longest
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from quickdraft.errors import InvalidParameterError
from quickdraft.prompts import chat_prompt_ids

MT_BENCH_KINDS = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_SINGLE_TURN = ("translation", "summarization", "qa", "math_reasoning", "rag")
CATEGORIES = ("mt_bench", *SPEC_BENCH_SINGLE_TURN, "code")
EXTRA_CATEGORIES = ("code_edit",)

# With a chat template, a HumanEval stub becomes a request; without one it is completed as is.
CODE_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        id: unique and stable, e.g. ``spec_bench/241`` or ``humaneval/HumanEval/0``.
        category: the category it is reported under.
        text: the user's message (the first turn).
        chat_text: what goes into the chat template when it differs from ``text`` (code stubs).
        token_ids: the prompt as token ids, for models without a tokenizer (user files only).
    """

    id: str
    category: str
    text: str = ""
    chat_text: str | None = None
    token_ids: tuple[int, ...] | None = None


def _data_file(*parts: str):
    return files("quickdraft").joinpath("data", *parts)


def _read_jsonl_gz(resource) -> list[dict]:
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def spec_bench_questions() -> list[dict]:
    """Spec-Bench's 480 questions (``question_id``, ``category``, ``turns``), in file order."""
    return _read_jsonl_gz(_data_file("spec_bench", "question.jsonl.gz"))


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
    ``entry_point``), in file order."""
    return _read_jsonl_gz(_data_file("humaneval", "HumanEval.jsonl.gz"))


# Code editing: the model is given a whole function and asked to rewrite it, so most of its answer
# repeats the request (what prompt lookup and the suffix cache draft for free).
CODE_EDIT_INSTRUCTION = ("Add type hints to this Python function and keep everything else as it is. "
                         "Reply with the whole function only.\n\n```python\n{code}```")


def code_edit_request(problem: dict) -> str:
    """The code-editing request of a HumanEval problem: its function with its solution."""
    return CODE_EDIT_INSTRUCTION.format(code=problem["prompt"] + problem["canonical_solution"])


def code_edit_requests(count: int) -> list[str]:
    """The first ``count`` code-editing requests."""
    return [code_edit_request(p) for p in humaneval_problems()[:count]]


# Structured extraction: the schema's keys, quotes and brackets are tokens the grammar forces,
# which speculation drafts for free (``quickdraft.drafters.forced``).
EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "people": {"type": "array", "items": {"type": "string"}},
                   "places": {"type": "array", "items": {"type": "string"}}, "summary": {"type": "string"}},
    "required": ["title", "people", "places", "summary"],
    "additionalProperties": False,
}
EXTRACTION_FORMAT = {"type": "json_schema", "json_schema": {"name": "extraction", "schema": EXTRACTION_SCHEMA}}
EXTRACTION_INSTRUCTION = ("Extract from this news passage a short title, the people and the places it names, "
                          "and a one-sentence summary, as JSON.\n\nPassage: {passage}")
# Words kept of each article: several names and places, and a prompt a CPU reads in seconds.
EXTRACTION_WORDS = 120


def extraction_requests(count: int) -> list[str]:
    """The first ``count`` extraction requests (answered under ``EXTRACTION_FORMAT``): Spec-Bench's
    summarization articles, each cut to its first ``EXTRACTION_WORDS`` words."""
    articles = [q["turns"][0].removeprefix("Summarize:").split() for q in spec_bench_questions()
                if q["category"] == "summarization"]
    return [EXTRACTION_INSTRUCTION.format(passage=" ".join(words[:EXTRACTION_WORDS])) for words in articles[:count]]


def mt_bench_conversations(count: int) -> list[tuple[str, str]]:
    """The first ``count`` of Spec-Bench's two-turn MT-Bench conversations (first turn, second turn),
    round-robin over the kinds as ``load_category("mt_bench")``."""
    return [(q["turns"][0], q["turns"][1]) for q in _mt_bench(spec_bench_questions(), count)]


def load_category(category: str, count: int) -> list[Prompt]:
    """The first ``count`` prompts of a category (see the module docstring for the order)."""
    if count < 1:
        raise InvalidParameterError(f"the number of prompts per category must be >= 1, got {count}")
    if category == "code":
        return [
            Prompt(id=f"humaneval/{p['task_id']}", category="code", text=p["prompt"],
                   chat_text=CODE_INSTRUCTION.format(prompt=p["prompt"]))
            for p in humaneval_problems()[:count]
        ]
    if category == "code_edit":
        return [Prompt(id=f"code_edit/{p['task_id']}", category=category, text=code_edit_request(p))
                for p in humaneval_problems()[:count]]
    questions = spec_bench_questions()
    if category == "mt_bench":
        chosen = _mt_bench(questions, count)
    elif category in SPEC_BENCH_SINGLE_TURN or category in MT_BENCH_KINDS:
        chosen = [q for q in questions if q["category"] == category][:count]
    else:
        known = ", ".join(CATEGORIES + EXTRA_CATEGORIES + MT_BENCH_KINDS)
        raise InvalidParameterError(f"unknown category {category!r}; choose from {known}")
    return [Prompt(id=f"spec_bench/{q['question_id']}", category=category, text=q["turns"][0]) for q in chosen]


def _mt_bench(questions: list[dict], count: int) -> list[dict]:
    """The first ``count`` MT-Bench questions, round-robin over the kinds: 3 are one writing, one
    roleplay, one reasoning."""
    by_kind = [[q for q in questions if q["category"] == kind] for kind in MT_BENCH_KINDS]
    return [q for row in zip_longest(*by_kind) for q in row if q is not None][:count]


def load_prompts_file(path: str | Path, count: int | None = None) -> list[Prompt]:
    """The user's prompts: one JSON object per line.

    Each line has ``"prompt"`` (text), ``"turns"`` (a list of user turns: the first is used) or
    ``"token_ids"`` (a list of ints, for models without a tokenizer), and optionally
    ``"category"`` (default ``custom``) and ``"id"`` (default: the line number). ``count`` keeps
    the first ``count`` prompts of each category.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"prompts file {path} does not exist")
    prompts: list[Prompt] = []
    taken: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidParameterError(f"{path}:{number}: not JSON ({error})") from error
        if not isinstance(row, dict):
            raise InvalidParameterError(f"{path}:{number}: expected a JSON object")
        category = str(row.get("category", "custom"))
        if count is not None and taken.get(category, 0) >= count:
            continue
        taken[category] = taken.get(category, 0) + 1
        prompt_id = f"{path.stem}/{row.get('id', number)}"
        if "token_ids" in row:
            prompts.append(Prompt(prompt_id, category, token_ids=tuple(int(t) for t in row["token_ids"])))
        elif "prompt" in row or "turns" in row:
            text = row["prompt"] if "prompt" in row else row["turns"][0]
            prompts.append(Prompt(prompt_id, category, text=str(text)))
        else:
            raise InvalidParameterError(f"{path}:{number}: needs 'prompt', 'turns' or 'token_ids'")
    if not prompts:
        raise InvalidParameterError(f"prompts file {path} holds no prompts")
    return prompts


def load_workload(categories: Sequence[str], per_category: int, prompts_file: str | Path | None = None) -> list[Prompt]:
    """The benchmark's prompts: the user's file when given, else the named built-in categories."""
    if prompts_file is not None:
        return load_prompts_file(prompts_file, per_category)
    return [prompt for category in categories for prompt in load_category(category, per_category)]


def prompt_ids(prompt: Prompt, tokenizer: PreTrainedTokenizerBase | None, chat: bool) -> list[int]:
    """Token ids of ``prompt``: through the chat template when ``chat`` is set and the tokenizer
    has one, else the plain text with the tokenizer's special tokens."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if tokenizer is None:
        raise InvalidParameterError(
            f"prompt {prompt.id} is text but the target has no tokenizer: give token_ids in a prompts file"
        )
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt.chat_text or prompt.text}])
    return tokenizer(prompt.text, add_special_tokens=True)["input_ids"]

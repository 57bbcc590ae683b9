"""What a benchmarked method is: one small Protocol, and what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from quickdraft.config import SamplingParams
from quickdraft.stats import DecodeStats


@dataclass
class Generation:
    """What one method produced: the new token ids, and the engine's counters when it has them."""

    token_ids: list[int]
    stats: DecodeStats | None = None


class Method(Protocol):
    """One way of generating: quickdraft's loop with some drafter, or a transformers peer.

    Attributes:
        name: short and unique, used in tables and JSON (``plain``, ``draft``, ``hf-assisted``).
        family: ``"quickdraft"`` or ``"transformers"``.
        plain: True when nothing is drafted: a candidate baseline.
        description: one line for the report.
    """

    name: str
    family: str
    plain: bool
    description: str

    def generate(self, prompt_ids: list[int], params: SamplingParams, k: int) -> Generation:
        """Exactly ``params.max_new_tokens`` tokens after ``prompt_ids``, drafting up to ``k`` per step."""
        ...

"""K by batch size: a ceiling on speculation that the operator sets by load.

vLLM's ``num_speculative_tokens_per_batch_size`` (``[first, last, K]`` ranges, K = 0 turning
speculation off) written ``FIRST-LAST:K`` and joined by commas, the last size of the last range
left open: ``1-8:5,9-16:1,17-:0``. Where a range covers the batch's size, no row drafts more than
its K that step; sizes no range covers keep the engine's K. The goodput policy still chooses below
that ceiling. A range with K = 0 is speculation off: no lookup, no draft forward, no probe.

A machine whose forwards over many positions cost about as much as one over a few (GPUs, AMX)
gains from drafting at wide batches; a small CPU does not (every row of 16 drafting one token
can run at three quarters of plain decoding's rate), and there the policy spends its probes
finding that out. The ceiling saves them where the operator knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quickdraft.errors import InvalidParameterError

_RANGE = re.compile(r"^(\d+)-(\d*):(\d+)$")


@dataclass(frozen=True)
class KByBatchSize:
    """Ranges of batch sizes, each with the most tokens a row drafts per step there.

    Attributes:
        ranges: ``(first, last, k)``, ``last`` None for an open end; sorted, not overlapping.
    """

    ranges: tuple[tuple[int, int | None, int], ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise InvalidParameterError("K by batch size needs at least one range, e.g. 1-8:5,9-:0")
        previous_last: int | None = 0
        for first, last, k in self.ranges:
            if first < 1 or (last is not None and last < first) or k < 0:
                raise InvalidParameterError(
                    f"K by batch size: range {_written(first, last, k)} must have 1 <= FIRST <= LAST and K >= 0")
            if previous_last is None or first <= previous_last:
                raise InvalidParameterError(
                    f"K by batch size: range {_written(first, last, k)} overlaps or comes before the one before it: "
                    "give the ranges in order of size, each starting after the last ended")
            previous_last = last

    @classmethod
    def parse(cls, text: str) -> KByBatchSize:
        """``FIRST-LAST:K[,FIRST-LAST:K...]`` (module docstring), e.g. ``1-8:5,9-16:1,17-:0``."""
        ranges = []
        for part in text.split(","):
            match = _RANGE.match(part.strip())
            if match is None:
                raise InvalidParameterError(
                    f"K by batch size: {part.strip()!r} is not FIRST-LAST:K (e.g. 9-16:1, or 17-:0 for every "
                    f"size from 17); got {text!r}")
            first, last, k = match.groups()
            ranges.append((int(first), int(last) if last else None, int(k)))
        return cls(tuple(ranges))

    def limit(self, size: int, k: int) -> int:
        """The most tokens a row drafts in a step of a batch of ``size`` requests, where the engine's K is ``k``."""
        for first, last, most in self.ranges:
            if first <= size and (last is None or size <= last):
                return min(k, most)
        return k

    def __str__(self) -> str:
        return ",".join(_written(*r) for r in self.ranges)


def _written(first: int, last: int | None, k: int) -> str:
    return f"{first}-{'' if last is None else last}:{k}"

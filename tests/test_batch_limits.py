"""K by batch size (``quickdraft.batch.limits``): parsing, checking and looking up the ranges."""

from __future__ import annotations

import pytest

from quickdraft.batch.limits import KByBatchSize
from quickdraft.errors import InvalidParameterError


def test_ranges_cap_k_by_size_and_leave_uncovered_sizes_at_k():
    limits = KByBatchSize.parse("1-4:3, 5-8:1,17-:0")
    assert [limits.limit(size, 5) for size in (1, 4, 5, 8, 9, 16, 17, 500)] == [3, 3, 1, 1, 5, 5, 0, 0]
    assert limits.limit(2, 2) == 2  # never above the engine's K
    assert str(limits) == "1-4:3,5-8:1,17-:0"
    assert KByBatchSize.parse(str(limits)) == limits


@pytest.mark.parametrize("text, message", [
    ("", "is not FIRST-LAST:K"),
    ("1-8", "is not FIRST-LAST:K"),
    ("1-8:-1", "is not FIRST-LAST:K"),
    ("a-8:1", "is not FIRST-LAST:K"),
    ("0-8:1", "1 <= FIRST <= LAST"),
    ("9-8:1", "1 <= FIRST <= LAST"),
    ("1-8:1,8-9:0", "overlaps or comes before"),
    ("9-16:1,1-8:2", "overlaps or comes before"),
    ("1-:2,9-16:0", "overlaps or comes before"),
])
def test_malformed_or_overlapping_ranges_are_refused_with_the_form_to_use(text, message):
    with pytest.raises(InvalidParameterError, match=message):
        KByBatchSize.parse(text)


def test_no_range_is_refused():
    with pytest.raises(InvalidParameterError, match="at least one range"):
        KByBatchSize(())

"""Batched speculative decoding: many requests in one forward per step (docs/batching.md)."""

from quickdraft.batch.engine import BatchEngine, Event
from quickdraft.batch.policy import FixedBatchK, GoodputPolicy, MeasuredCosts, RowOutlook

__all__ = ["BatchEngine", "Event", "FixedBatchK", "GoodputPolicy", "MeasuredCosts", "RowOutlook"]

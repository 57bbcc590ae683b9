"""Batched speculative decoding: many requests in one forward per step (docs/batching.md)."""

from quickdraft.batch.engine import BatchEngine, Event
from quickdraft.batch.policy import Decision, FixedBatchK, GoodputPolicy, MeasuredCosts, RowOutlook

__all__ = ["BatchEngine", "Decision", "Event", "FixedBatchK", "GoodputPolicy", "MeasuredCosts", "RowOutlook"]

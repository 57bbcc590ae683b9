"""Batched speculative decoding: many requests in one forward per step (docs/batching.md)."""

from quickdraft.batch.engine import BatchEngine, Event
from quickdraft.batch.policy import GoodputPolicy
from quickdraft.costs import MeasuredCosts, RowOutlook
from quickdraft.policy import Decision

__all__ = ["BatchEngine", "Decision", "Event", "GoodputPolicy", "MeasuredCosts", "RowOutlook"]

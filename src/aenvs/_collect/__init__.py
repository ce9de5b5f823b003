"""The streaming collector: :func:`collect` over a pool, yielding episodes and frame batches."""

from aenvs._collect.collector import Collector, collect
from aenvs._collect.outputs import Episode, FrameBatch

__all__ = ["Collector", "Episode", "FrameBatch", "collect"]

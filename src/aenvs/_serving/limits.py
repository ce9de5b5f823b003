"""What one client connection may do: episodes open at once, messages a second, idle time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

__all__ = ["Bucket", "Limits"]


@dataclass(frozen=True)
class Limits:
    """The per-connection limits of a server; None lifts one.

    Example:
        >>> Limits(max_episodes=64, max_messages_per_second=1000.0, idle_timeout=None)
        Limits(max_episodes=64, max_messages_per_second=1000.0, idle_timeout=None)
        >>> Limits(max_episodes=0, max_messages_per_second=None, idle_timeout=None)
        Traceback (most recent call last):
        ...
        ValueError: max_episodes_per_connection must be a positive int or None, got 0
    """

    max_episodes: int | None
    max_messages_per_second: float | None
    idle_timeout: float | None

    def __post_init__(self) -> None:
        episodes = cast(object, self.max_episodes)
        if episodes is not None and (
            isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1
        ):
            raise ValueError(f"max_episodes_per_connection must be a positive int or None, got {episodes!r}")
        for name in ("max_messages_per_second", "idle_timeout"):
            value = cast(object, getattr(self, name))
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")


class Bucket:
    """A token bucket: ``rate`` messages a second, and bursts of up to a second's worth.

    Example:
        >>> bucket = Bucket(2.0, now=0.0)
        >>> [bucket.take(now=0.0) for _ in range(3)], bucket.take(now=0.5)
        ([True, True, False], True)
    """

    __slots__ = ("_at", "_capacity", "_level", "_rate")

    def __init__(self, rate: float, *, now: float) -> None:
        self._rate = rate
        self._capacity = self._level = max(rate, 1.0)
        self._at = now

    def take(self, *, now: float) -> bool:
        """Take one message's worth; False when the bucket is empty (over the rate)."""
        self._level = min(self._capacity, self._level + (now - self._at) * self._rate)
        self._at = now
        if self._level < 1.0:
            return False
        self._level -= 1.0
        return True

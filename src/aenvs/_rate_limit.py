"""A token bucket that bounds the rate of env commands: :class:`~aenvs.RateLimit`.

It imports nothing heavy (no torch): the command line builds one while parsing its options.
"""

from __future__ import annotations

import math
import threading
import time
from typing import cast

__all__ = ["RateLimit"]


class RateLimit:
    """A token bucket: ``per_second`` tokens a second, at most ``burst`` saved up.

    A pool given ``rate_limit=`` takes one token per env for each transition command it
    dispatches (reset, step, step-and-reset), holding the command until a token comes.
    One RateLimit given to several pools (in one event loop or several threads) bounds
    them together, as an API quota shared by every env that talks to one service.

    Args:
        per_second: tokens added each second (> 0).
        burst: tokens the bucket holds at most (>= 1); it starts full.

    Example:
        >>> import asyncio, torch
        >>> from aenvs import AsyncEnvPool, RateLimit
        >>> quota = RateLimit(per_second=50.0, burst=4)
        >>> async def main():
        ...     async with AsyncEnvPool("CartPole-v1", num_envs=4, executor="inline", rate_limit=quota) as pool:
        ...         await pool.reset()  # 4 tokens: the burst
        ...         td = await pool.rand_step()  # 4 more, one every 20 ms
        ...         return pool.stats().limit_wait_seconds > 0
        >>> asyncio.run(main())
        True
        >>> quota.take(10) <= 4
        True
    """

    def __init__(self, per_second: float, burst: int = 1) -> None:
        given = cast(object, per_second)
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise TypeError(f"per_second must be a number, got {type(given).__name__}")
        if not math.isfinite(per_second) or per_second <= 0:
            raise ValueError(f"per_second must be a finite number > 0, got {per_second}")
        given = cast(object, burst)
        if isinstance(given, bool) or not isinstance(given, int):
            raise TypeError(f"burst must be an int, got {type(given).__name__}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.per_second = float(per_second)
        self.burst = burst
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock = threading.Lock()  # pools on several threads' loops may share one

    def __repr__(self) -> str:
        return f"RateLimit(per_second={self.per_second!r}, burst={self.burst!r})"

    def take(self, count: int = 1) -> int:
        """Take up to ``count`` of the tokens there are now; return how many were taken."""
        with self._lock:
            self._refill()
            # a hair of slack: float sums of refills land a whole token a few ulps short
            taken = max(0, min(count, int(self._tokens + 1e-9)))
            self._tokens -= taken
        return taken

    def seconds_until_token(self) -> float:
        """Seconds until the bucket holds a whole token (0.0 if it does now)."""
        with self._lock:
            self._refill()
            return max(0.0, (1.0 - self._tokens) / self.per_second)

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.per_second)
        self._updated = now

"""PoolStats: a snapshot of a pool's activity."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's activity (``pool.stats()``).

    Attributes:
        steps: steps completed per env.
        step_latency_mean / step_latency_last: seconds from send to completion, per env
            (measured when the pool collects the completion).
        errors: failed commands per env.
        in_flight: commands sent whose completion has not arrived.
        ready: results arrived but not yet received.
        steps_per_second: completed steps over the time since the pool started.
        restarts: times each env was rebuilt (``on_error="restart"``).
        timeouts: commands per env that outlived ``step_timeout`` / ``reset_timeout``.
        abandoned_threads: threads given up on in a stuck env (thread executor), still running.
        receiving: receives waiting for results now (several when tasks receive concurrently).
        in_flight_envs: the envs whose command has not been answered yet, by index.
    """

    steps: list[int]
    step_latency_mean: list[float]
    step_latency_last: list[float]
    errors: list[int]
    in_flight: int
    ready: int
    steps_per_second: float
    uptime: float
    restarts: list[int]
    timeouts: list[int]
    abandoned_threads: int
    receiving: int = 0
    in_flight_envs: list[int] = field(default_factory=list[int])

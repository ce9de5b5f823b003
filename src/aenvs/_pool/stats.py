"""PoolStats: a snapshot of a pool's activity; LatencyPercentiles: one latency series of it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LatencyPercentiles", "PoolStats"]


@dataclass(frozen=True)
class LatencyPercentiles:
    """Percentiles (seconds) of one latency series over each env's window of recent samples.

    Attributes:
        p50 / p90 / p99: per env, over its window (0.0 for an env with no sample yet).
        pool_p50 / pool_p90 / pool_p99: over every env's window together (past 65,536
            samples in all, estimated from 65,536 of them drawn at random: the rank of a
            pool-wide p50 is then within about 0.2 percentile of the 50th, of a p99 0.04).
        samples: per env, the samples in its window (the most recent ones, at most 256).

    Example:
        >>> LatencyPercentiles.empty(2)
        LatencyPercentiles(p50=[0.0, 0.0], p90=[0.0, 0.0], p99=[0.0, 0.0], pool_p50=0.0, pool_p90=0.0, pool_p99=0.0, samples=[0, 0])
    """

    p50: list[float]
    p90: list[float]
    p99: list[float]
    pool_p50: float
    pool_p90: float
    pool_p99: float
    samples: list[int]

    @classmethod
    def empty(cls, num_envs: int = 0) -> LatencyPercentiles:
        """No sample for any of ``num_envs`` envs: every percentile 0.0."""
        zeros = [0.0] * num_envs
        return cls(list(zeros), list(zeros), list(zeros), 0.0, 0.0, 0.0, [0] * num_envs)


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's activity (``pool.stats()``).

    Attributes:
        steps: steps completed per env.
        step_latency_mean / step_latency_last: seconds from dispatch to completion, per env
            (measured when the pool collects the completion; a command held by the pool's
            limits is dispatched when they let it go).
        errors: failed commands per env.
        in_flight: commands sent whose completion has not arrived (held ones included).
        ready: results arrived but not yet received.
        steps_per_second: completed steps over the time since the pool started.
        restarts: times each env was rebuilt (``on_error="restart"``).
        timeouts: commands per env that outlived ``step_timeout`` / ``reset_timeout``.
        abandoned_threads: threads given up on in a stuck env (thread executor), still running.
        receiving: receives waiting for results now (several when tasks receive concurrently).
        in_flight_envs: the envs whose command has not been answered yet, by index.
        env_latency: time in the env, per transition command (reset, step,
            step-and-reset): from its dispatch to its completion.
        policy_wait: time an env waited for its caller: from its result being received to
            the next transition command sent to it.
        limit_wait: time a transition command waited on the pool's limits
            (``max_concurrency``, ``rate_limit``): from its send to its dispatch, 0 when
            nothing held it (no sample without limits).
        limit_wait_seconds: total seconds commands spent held by the limits.
        held: commands held by the limits now (sent, not dispatched yet).
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
    env_latency: LatencyPercentiles = field(default_factory=LatencyPercentiles.empty)
    policy_wait: LatencyPercentiles = field(default_factory=LatencyPercentiles.empty)
    limit_wait: LatencyPercentiles = field(default_factory=LatencyPercentiles.empty)
    limit_wait_seconds: float = 0.0
    held: int = 0

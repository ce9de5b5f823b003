"""Latency percentiles in ``pool.stats()``: time in the env, time waiting for the policy, time
waiting on the pool's limits; per env and over the pool."""

from __future__ import annotations

import asyncio
import time
from array import array

import numpy as np
import pytest

from aenvs._pool.latency import POOL_SAMPLES, WINDOW, LatencyWindows
from aenvs._pool.stats import LatencyPercentiles
from aenvs.testing import echo_env_fns
from tests.behaviour.limit_envs import stair_env_fns
from tests.helpers import actions

EPSILON = 1e-6
TIMER_RESOLUTION = 0.001


async def test_env_latency_percentiles_follow_the_envs_delays(make_pool) -> None:
    unit, steps = 0.002, 10
    pool = await make_pool(stair_env_fns(3, unit))
    calls = []  # each call's own duration: no sample of it can be longer
    start = time.perf_counter()
    await pool.reset()
    calls.append(time.perf_counter() - start)
    for _ in range(steps):
        start = time.perf_counter()
        await pool.step(actions([1, 1, 1]))
        calls.append(time.perf_counter() - start)
    latency = pool.stats().env_latency
    # each sample is at least its step's sleep (the reset's: 0), so each percentile is at
    # least the same percentile of the sleeps, less the loop's timer resolution (libuv, under
    # uvloop, counts time in whole milliseconds: a sleep may end up to 1 ms early by our clock);
    # and at most the same percentile of the calls' durations (samples are float32: EPSILON)
    sleeps = np.array([0.0] + [unit * (k % 10) for k in range(1, steps + 1)])
    floor = np.percentile(sleeps, (50, 90, 99)) - TIMER_RESOLUTION
    ceiling = np.percentile(calls, (50, 90, 99)) + EPSILON
    assert latency.samples == [steps + 1] * 3
    for i in range(3):
        assert latency.p50[i] <= latency.p90[i] <= latency.p99[i]
        assert floor[0] <= latency.p50[i] <= ceiling[0]
        assert floor[1] <= latency.p90[i] <= ceiling[1]
        assert floor[2] <= latency.p99[i] <= ceiling[2]
    assert latency.pool_p50 <= latency.pool_p90 <= latency.pool_p99
    pool_ceiling = np.percentile(np.repeat(calls, 3), (50, 99)) + EPSILON  # every env's samples
    assert floor[0] <= latency.pool_p50 <= pool_ceiling[0] and floor[2] <= latency.pool_p99 <= pool_ceiling[1]


async def test_policy_wait_is_the_time_the_caller_takes(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    for _ in range(4):
        await pool.async_step_send(actions([1, 1]))
        await pool.async_step_recv(min_get=2)
        await asyncio.sleep(0.02)  # the "policy"
    stats = pool.stats()
    wait = stats.policy_wait
    assert wait.samples == [4, 4]  # reset to the first step, then between steps
    assert min(wait.p50) >= 0.015 and wait.pool_p50 >= 0.015
    assert stats.limit_wait.samples == [0, 0] and stats.limit_wait.pool_p99 == 0.0  # no limits
    assert stats.held == 0 and stats.limit_wait_seconds == 0.0


async def test_limit_wait_is_the_time_held_and_env_latency_starts_at_the_dispatch(make_pool) -> None:
    delay = 0.02
    pool = await make_pool(echo_env_fns(3, asynchronous=True, delay=delay), max_concurrency=1)
    await pool.reset()
    sent = time.perf_counter()
    await pool.async_step_send(actions([1, 1, 1]))
    await pool.async_step_recv(min_get=3)
    received = time.perf_counter()
    stats = pool.stats()
    # one at a time, in the order sent: env 1 waited for env 0's step, env 2 for both
    assert stats.limit_wait_seconds >= delay + 2 * delay
    assert stats.limit_wait.samples == [2, 2, 2]  # the reset and the step
    assert max(stats.limit_wait.p99) >= 0.99 * 2 * delay
    # env 2 was dispatched at least 2 * delay after the send: its time in the env excludes that
    # (its sleep may end up to TIMER_RESOLUTION early, as above)
    assert delay - TIMER_RESOLUTION <= stats.step_latency_last[2] <= received - sent - 2 * delay


def _windows_of(samples_by_env: list[list[float]]) -> LatencyWindows:
    windows = LatencyWindows(len(samples_by_env))
    for i, samples in enumerate(samples_by_env):
        for seconds in samples:
            windows.add(i, seconds)
    return windows


def test_window_percentiles_are_numpys_over_each_env_s_last_samples() -> None:
    rng = np.random.default_rng(7)
    # empty, one sample, part of a window, a full one, one that wrapped (its oldest forgotten)
    lengths = [0, 1, 5, WINDOW - 1, WINDOW, WINDOW + 37, 3 * WINDOW + 1]
    samples = [rng.lognormal(-3, 1, n).astype(np.float32).tolist() for n in lengths]  # kept as float32
    windows = _windows_of(samples)
    kept = [s[-WINDOW:] for s in samples]
    p = windows.percentiles()
    assert p.samples == [len(s) for s in kept]
    for i, s in enumerate(kept):
        expected = np.percentile(s, (50, 90, 99)).tolist() if s else [0.0] * 3
        assert [p.p50[i], p.p90[i], p.p99[i]] == pytest.approx(expected, rel=1e-6, abs=0)
    everything = [x for s in kept for x in s]
    pool = [p.pool_p50, p.pool_p90, p.pool_p99]
    assert pool == pytest.approx(np.percentile(everything, (50, 90, 99)).tolist(), rel=1e-6)
    windows.clear()
    assert windows.percentiles() == LatencyPercentiles.empty(len(lengths))


@pytest.mark.parametrize("fill", ["full", "partly"])
def test_window_percentiles_past_the_pool_wide_sample(fill: str) -> None:
    num_envs = POOL_SAMPLES // WINDOW * 4  # four times POOL_SAMPLES when every window is full
    rng = np.random.default_rng(8)
    rows = rng.lognormal(-3, 1, (num_envs, WINDOW)).astype(np.float32).astype(np.float64)
    rows[num_envs // 2 :] *= 8  # half the envs ten times slower: per env figures must follow
    counts = np.full(num_envs, WINDOW) if fill == "full" else rng.integers(1, WINDOW, num_envs)
    for i, n in enumerate(counts):
        rows[i, n:] = np.nan
    windows = LatencyWindows(num_envs)
    windows.ring[:] = array("f", rows.ravel().tolist())
    windows.counts[:] = counts.tolist()
    p = windows.percentiles()
    assert p.samples == counts.tolist()
    expected = np.nanpercentile(rows, (50, 90, 99), axis=1)
    assert np.array([p.p50, p.p90, p.p99]) == pytest.approx(expected, rel=1e-6)
    # pool-wide: estimated from POOL_SAMPLES of the samples; the rank of each estimate is
    # within 3 standard errors (sqrt(q (1 - q) / POOL_SAMPLES)) of the percentile asked
    everything = np.sort(rows[~np.isnan(rows)])
    assert everything.size > POOL_SAMPLES
    for q, value in zip((50, 90, 99), (p.pool_p50, p.pool_p90, p.pool_p99), strict=True):
        rank = 100 * np.searchsorted(everything, value) / everything.size
        error = 300 * np.sqrt(q / 100 * (1 - q / 100) / POOL_SAMPLES)
        assert q - error <= rank <= q + error

"""Cancelling a waiting receive at random points loses and duplicates nothing (10^4 cancellations)."""

from __future__ import annotations

import asyncio
import random

import pytest

from aenvs.testing import echo_env_fns
from tests.faults.support import WAIT, echo_actions

NUM_ENVS = 4
CANCELLATIONS = 10_000


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_ten_thousand_cancelled_receives_lose_nothing(make_pool, executor: str) -> None:
    rng = random.Random(0)
    delay = (0.0, 0.0002) if executor != "inline" else 0.0
    pool = await make_pool(echo_env_fns(NUM_ENVS, delay=delay, asynchronous=executor == "inline"))
    await pool.reset()
    sent = [0] * NUM_ENVS
    received: list[list[int]] = [[] for _ in range(NUM_ENVS)]

    def record(out) -> None:
        for i, step in zip(out["env_index"].tolist(), out["next", "observation"][:, 2].tolist(), strict=True):
            received[i].append(int(step))

    idle = list(range(NUM_ENVS))
    cancelled = 0
    async with asyncio.timeout(WAIT * 8):
        while cancelled < CANCELLATIONS:
            if idle:
                await pool.async_step_send(echo_actions(len(idle), env_index=idle))
                for i in idle:
                    sent[i] += 1
            recv = asyncio.ensure_future(pool.async_step_recv(min_get=rng.randint(1, NUM_ENVS)))
            for _ in range(rng.randint(0, 3)):  # cancel at a random point of the receive
                await asyncio.sleep(0)
            recv.cancel()
            try:
                out = await recv
            except asyncio.CancelledError:
                cancelled += 1
                out = None
            if out is not None:
                record(out)
            # whatever is ready now is taken; the rest stays in flight for the next round
            ready = pool.stats().ready
            if ready:
                record(await pool.async_step_recv(min_get=ready))
            in_flight = set(range(NUM_ENVS)) - {i for i in range(NUM_ENVS) if len(received[i]) == sent[i]}
            idle = [i for i in range(NUM_ENVS) if i not in in_flight]
        pending = sum(sent) - sum(len(r) for r in received)
        if pending:
            record(await pool.async_step_recv(min_get=pending))
    for i in range(NUM_ENVS):  # each env's results: every step exactly once, in order
        assert received[i] == list(range(1, sent[i] + 1)), f"env {i}"
    assert pool.stats().in_flight == 0 and pool.stats().ready == 0

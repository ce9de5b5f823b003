"""benchmarks/latency.py's reference rows: TimerPool and ThreadTimerPool, the no-pool stand-ins
the pool rows are compared with, answer every send once, in the pool's layout, within max_get."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import torch
from tensordict import TensorDict

from aenvs import AsyncEnvPool
from benchmarks import latency

N = 6


async def _pool_step() -> TensorDict:
    async with AsyncEnvPool([latency.AsyncSleepyEnv] * N, executor="inline") as pool:
        td = await pool.reset()
        td["action"] = torch.zeros(N, dtype=torch.int64)
        await pool.async_step_send(td)
        return await pool.async_step_recv(min_get=N)


async def _reference_steps(max_get: int | None, threads: bool) -> list[TensorDict]:
    with concurrent.futures.ThreadPoolExecutor(N) as executor:
        reference = latency.ThreadTimerPool(N, executor) if threads else latency.TimerPool(N)
        actions = torch.arange(N, dtype=torch.int64) * 10
        reference.send(TensorDict(action=actions, env_index=torch.arange(N), batch_size=[N]))
        outs = []
        while reference.in_flight:
            outs.append(await asyncio.wait_for(reference.recv(max_get), timeout=5))
    return outs


@pytest.mark.parametrize("threads", [False, True], ids=["timers", "threads"])
def test_the_reference_answers_every_env_once_in_the_pools_layout(threads: bool) -> None:
    expected = asyncio.run(_pool_step())
    for max_get in (None, 4):
        outs = asyncio.run(_reference_steps(max_get, threads))
        received = [i for out in outs for i in out["env_index"].tolist()]
        assert sorted(received) == list(range(N)), max_get
        for out in outs:
            assert max_get is None or out.batch_size[0] <= max_get
            indices = out["env_index"].tolist()
            assert indices == sorted(indices)
            assert out["action"].tolist() == [10 * i for i in indices]  # each env's own action
            nxt = out["next"]
            assert set(nxt.keys()) == set(expected["next"].keys())
            for key, value in expected["next"].items():
                assert nxt[key].shape[1:] == value.shape[1:] and nxt[key].dtype == value.dtype, key
                assert torch.equal(nxt[key], value[: len(indices)]), key  # the env's step result

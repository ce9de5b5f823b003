"""What only the process executor has: workers, shared memory, crashes, cleanup."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from aenvs import AsyncEnvPool, EnvContext, EnvCrashedError
from aenvs.executors import ProcessExecutor
from aenvs.testing import EchoEnv, echo_env_fns
from tests.helpers import Gate, actions, assert_gone, gated_env_fns, shm_entries, until


async def test_lambda_factories_travel_by_value() -> None:
    size = 3
    async with AsyncEnvPool([lambda: gym.make("CartPole-v1")] * 2, executor="process") as pool:
        td = await pool.reset()
        assert td["observation"].shape == (2, 4)
        closure = await pool.get_attr("spec")
        assert closure[0].id == "CartPole-v1"
    async with AsyncEnvPool(
        lambda: gym.make("MountainCar-v0", max_episode_steps=size), num_envs=2, executor="process"
    ) as pool:
        assert (await pool.reset())["observation"].shape == (2, 2)


async def test_several_envs_per_worker_one_message_each() -> None:
    executor = ProcessExecutor(envs_per_worker=3)
    async with AsyncEnvPool(echo_env_fns(5), executor=executor) as pool:
        assert len(executor.pids) == 2
        await pool.reset()
        out = await pool.step(actions([1, 2, 3, 4, 5]))
        assert out["next", "observation"][:, 0].tolist() == [0, 1, 2, 3, 4]
        assert out["next", "observation"][:, 1].tolist() == [1, 2, 3, 4, 5]
        assert await pool.call("_delay") == [0.0] * 5


async def test_default_spreads_envs_over_the_cores() -> None:
    executor = ProcessExecutor()
    async with AsyncEnvPool(echo_env_fns(8), executor=executor):
        assert len(executor.pids) == min(os.cpu_count() or 1, 8)


async def test_auto_reset_happens_in_the_worker() -> None:
    async with AsyncEnvPool(
        echo_env_fns(2, episode_length=1), executor=ProcessExecutor(num_workers=1)
    ) as pool:
        td = await pool.reset()
        td["action"] = torch.ones(2, 1, dtype=torch.float64)
        for round_ in range(1, 4):
            out, td = await pool.step_and_maybe_reset(td)
            td["action"] = torch.ones(2, 1, dtype=torch.float64)
            assert out["next", "done"].all()
            assert td["observation"][:, 2].tolist() == [0.0, 0.0]
            # the pool sent no reset command: the worker's env counted each reset itself
            assert await pool.get_attr("resets") == [round_ + 1] * 2


async def test_large_observations_and_specs_travel() -> None:
    """4x84x84 uint8 frames through shared memory; specs larger than a socket buffer (uvloop)."""

    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.full((4, 84, 84), 7, np.uint8), {}

        def step(self, action):
            return np.full((4, 84, 84), action, np.uint8), 1.0, False, False, {}

    async with AsyncEnvPool([Pixels] * 4, executor=ProcessExecutor(num_workers=2)) as pool:
        assert int((await pool.reset())["observation"].sum()) == 7 * 4 * 4 * 84 * 84
        td = await pool.step(TensorDict(action=torch.tensor([0, 1, 0, 1]), batch_size=[4]))
        assert td["next", "observation"].flatten(1).amax(1).tolist() == [0, 1, 0, 1]


async def test_sigkill_mid_step_is_env_crashed_for_exactly_its_envs(tmp_path) -> None:
    gate = Gate(str(tmp_path))
    executor = ProcessExecutor(num_workers=2)
    async with AsyncEnvPool(gated_env_fns(4, gate), executor=executor) as pool:
        await pool.reset()
        await pool.async_step_send(actions([1, 2, 3, 4]))
        victim = executor.pids[0]  # hosts envs 0 and 1
        started = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        crashed = []
        async with asyncio.timeout(1.0):
            for _ in range(2):
                with pytest.raises(EnvCrashedError) as info:
                    await pool.async_step_recv(min_get=1)
                crashed.append(info.value.env_index)
                assert f"pid {victim}" in str(info.value)
        assert sorted(crashed) == [0, 1]
        assert time.monotonic() - started < 1.0
        gate.open()
        out = await pool.async_step_recv(min_get=2)
        assert out["env_index"].tolist() == [2, 3]
        assert out["next", "observation"][:, 1].tolist() == [3.0, 4.0]
        await pool.async_step_send(actions([1], env_index=[0]))  # a dead worker answers at once
        with pytest.raises(EnvCrashedError):
            await pool.async_step_recv(timeout=1)
        await pool.step(actions([5, 6], env_index=[2, 3]))  # the other worker still steps
    assert_gone([victim, *executor.pids])


@pytest.mark.parametrize("situation", ["idle", "after-crash", "hung-step"])
async def test_close_leaves_no_process_and_no_shared_memory(tmp_path, situation: str) -> None:
    before = shm_entries()
    gate = Gate(str(tmp_path))  # never opened: a step sent to it hangs
    executor = ProcessExecutor(num_workers=2, close_timeout=0.5)
    pool = AsyncEnvPool(gated_env_fns(4, gate), executor=executor)
    await pool.start()
    pids = list(executor.pids)
    await pool.reset()
    if situation != "idle":
        await pool.async_step_send(actions([1, 2, 3, 4]))
    if situation == "after-crash":
        os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    await pool.aclose()
    assert time.monotonic() - started < 3.0
    assert_gone(pids)
    assert shm_entries() <= before


def _stuck_on_rebuild(armed: str, building: str, num_envs: int) -> list[Any]:
    """EchoEnv factories whose builds, once the file ``armed`` exists, create ``building``
    and never end (until the worker is stopped)."""

    def make(ctx: EnvContext) -> EchoEnv:
        if os.path.exists(armed):
            with open(building, "w"):
                pass
            while True:
                time.sleep(0.01)
        return EchoEnv(env_index=ctx.env_index)

    return [make] * num_envs


async def test_a_restart_cut_short_by_close_logs_no_unretrieved_error(tmp_path, caplog) -> None:
    """The pool closes while a worker (two envs) is being started again: the new worker is
    stopped, and the error its start ends with is taken, never left for the garbage
    collector to log at some later moment ("Future exception was never retrieved")."""
    armed, building = tmp_path / "armed", tmp_path / "building"
    executor = ProcessExecutor(envs_per_worker=2)
    env_fns = _stuck_on_rebuild(str(armed), str(building), 4)
    async with AsyncEnvPool(env_fns, executor=executor, on_error="restart") as pool:
        await pool.reset()
        armed.touch()
        # killed before the step goes out: an echo step is answered faster than a kill lands
        os.kill(executor.pids[0], signal.SIGKILL)
        await pool.async_step_send(actions([1, 2], env_index=[0, 1]))
        for _ in range(2):
            with pytest.raises(EnvCrashedError):
                await pool.async_step_recv(min_get=1)
        await until(building.exists)  # its successor builds the envs: the pool closes now
    del pool, executor
    gc.collect()
    assert "never retrieved" not in caplog.text


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("spin_wait", [0.0, 0.0003, 0.05])
async def test_spin_wait_changes_when_a_side_sleeps_not_what_it_gets(tmp_path, spin_wait: float) -> None:
    """Polling before sleeping (none, the default, a long window) on both sides of the pipe:
    the same results, a slow step still waited for, and nothing lost."""
    gate = Gate(str(tmp_path))
    executor = ProcessExecutor(num_workers=2, spin_wait=spin_wait)
    async with AsyncEnvPool(gated_env_fns(4, gate), executor=executor) as pool:
        await pool.reset()
        await pool.async_step_send(actions([7, 8, 9, 10]))
        assert (await pool.async_step_recv(min_get=0))["env_index"].numel() == 0
        gate.open()  # the answer comes after any window: the waiting side slept
        out = await pool.async_step_recv(min_get=4, timeout=10)
        assert sorted(out["next", "observation"][:, 1].tolist()) == [7.0, 8.0, 9.0, 10.0]
        for round_ in range(1, 21):  # lockstep: each side's next message follows at once
            out = await pool.step(actions([round_] * 4))
            assert out["next", "observation"][:, 1].tolist() == [float(round_)] * 4


async def test_an_idle_pool_and_its_workers_stop_polling() -> None:
    """After a burst of lockstep steps (which spin), neither the pool's process nor a worker
    keeps polling once nothing comes: over half a second idle they use a small part of it."""
    executor = ProcessExecutor(num_workers=2)
    async with AsyncEnvPool(["CartPole-v1"] * 4, executor=executor) as pool:
        td = await pool.reset()
        for _ in range(200):
            td["action"] = torch.zeros(4, dtype=torch.int64)
            _, td = await pool.step_and_maybe_reset(td)
        pids = executor.pids
        before = [_cpu_seconds(pid) for pid in pids], time.process_time()
        await asyncio.sleep(0.5)  # the idle time measured, not a wait for something to happen
        workers = [_cpu_seconds(pid) - b for pid, b in zip(pids, before[0], strict=True)]
        own = time.process_time() - before[1]
    assert max(workers) < 0.1, workers  # polling all along would be ~0.5 s each
    assert own < 0.1, own


async def test_a_pool_waiting_on_slow_steps_stops_polling() -> None:
    """Steps of 0.2 s, a 10 ms window: the pool's process polls through the first step's
    window, sees the answer take twenty windows, and sleeps at once from then on (polling
    each window would take 80 ms of CPU over the 8 steps, polling throughout 1.6 s)."""
    executor = ProcessExecutor(num_workers=2, spin_wait=0.01)
    async with AsyncEnvPool(echo_env_fns(2, delay=0.2), executor=executor) as pool:
        await pool.reset()
        began = time.process_time()
        for round_ in range(1, 9):
            out = await pool.step(actions([round_, round_]))
            assert out["next", "observation"][:, 1].tolist() == [float(round_)] * 2
        own = time.process_time() - began
    assert own < 0.04, own

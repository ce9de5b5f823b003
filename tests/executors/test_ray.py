"""What only the ray executor has: actors, their batches, their deaths, Ray's lifetime.

These run on the session's local Ray instance (tests/ray_session.py), one node.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import textwrap
import threading
from typing import ClassVar

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from tensordict import TensorDict

from aenvs import AsyncEnvPool, EnvContext, EnvCrashedError
from aenvs._commands import CommandKind
from aenvs.executors import RayExecutor, make_executor
from aenvs.testing import EchoEnv, echo_env_fns
from tests.helpers import Gate, actions, assert_gone, gated_env_fns
from tests.ray_session import LOCAL_RAY, actors_left

WAIT = 30.0


@pytest.fixture(autouse=True)
def local_ray() -> None:
    LOCAL_RAY.ensure()


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'aenvs\[ray\]'"):
        make_executor("ray")


def test_importing_aenvs_imports_no_ray() -> None:
    code = "import sys, aenvs, aenvs.executors, aenvs._pool; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=WAIT)


async def test_several_envs_per_actor_one_call_per_actor() -> None:
    executor = RayExecutor(envs_per_worker=3)
    async with AsyncEnvPool(echo_env_fns(5), executor=executor) as pool:
        assert len(executor.pids) == 2 and len(set(executor.pids)) == 2
        await pool.reset()
        out = await pool.step(actions([1, 2, 3, 4, 5]))
        assert out["next", "observation"][:, 0].tolist() == [0, 1, 2, 3, 4]
        assert out["next", "observation"][:, 1].tolist() == [1, 2, 3, 4, 5]
        assert await pool.call("_delay") == [0.0] * 5
        # the executor plans (and makes) one remote call per actor for each command
        calls = []
        plan = executor._plan

        def counting_plan(w, envs):
            calls.append(tuple(envs))
            return plan(w, envs)

        executor._plan = counting_plan  # type: ignore[method-assign]
        await pool.step(actions([1, 1, 1, 1, 1]))
        assert calls == [(0, 1, 2), (3, 4)]


def _barrier_env(parties: int):
    """Envs whose steps after their first wait for ``parties`` steps of the same actor to be
    running at once (the first step of a kind of env runs alone: it may still import modules)."""

    class BarrierEnv(EchoEnv):
        barriers: ClassVar[dict[int, threading.Barrier]] = {}
        steps = 0

        def step(self, td):
            self.steps += 1
            if self.steps > 1:
                barrier = BarrierEnv.barriers.setdefault(os.getpid(), threading.Barrier(parties))
                barrier.wait(timeout=10)  # raises BrokenBarrierError if the envs run one after another
            return super().step(td)

    def make(ctx: EnvContext) -> EchoEnv:
        return BarrierEnv(env_index=ctx.env_index)

    return make


async def test_envs_of_one_actor_step_concurrently() -> None:
    async with AsyncEnvPool([_barrier_env(4)] * 4, executor=RayExecutor(envs_per_worker=4)) as pool:
        await pool.reset()
        for _ in range(3):
            out = await pool.step(actions([1, 2, 3, 4]))
            assert out["next", "observation"][:, 1].tolist() == [1, 2, 3, 4]


async def test_large_observations_travel_through_the_object_store() -> None:
    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            return np.full((4, 84, 84), 7, np.uint8), {}

        def step(self, action):
            return np.full((4, 84, 84), action, np.uint8), 1.0, False, False, {}

    # 8 frames of 28 KB per actor: 226 KB per answer, above Ray's inline limit (100 KB)
    async with AsyncEnvPool([Pixels] * 16, executor=RayExecutor(num_workers=2)) as pool:
        assert int((await pool.reset())["observation"].sum()) == 7 * 16 * 4 * 84 * 84
        chosen = torch.tensor([i % 3 for i in range(16)])
        for _ in range(3):
            out, _ = await pool.step_and_maybe_reset(TensorDict(action=chosen, batch_size=[16]))
            assert out["next", "observation"].flatten(1).amax(1).tolist() == chosen.tolist()
            assert out["next", "observation"].flatten(1).amin(1).tolist() == chosen.tolist()


async def test_sigkill_mid_step_is_env_crashed_for_exactly_its_envs(tmp_path) -> None:
    gate = Gate(str(tmp_path))
    executor = RayExecutor(num_workers=2)
    async with AsyncEnvPool(gated_env_fns(4, gate), executor=executor) as pool:
        await pool.reset()
        await pool.async_step_send(actions([1, 2, 3, 4]))
        victim = executor.pids[0]  # hosts envs 0 and 1
        psutil.Process(victim).kill()
        crashed = []
        async with asyncio.timeout(WAIT):
            for _ in range(2):
                with pytest.raises(EnvCrashedError) as info:
                    await pool.async_step_recv(min_get=1)
                crashed.append(info.value.env_index)
                assert f"pid {victim}" in str(info.value) and "ray" in str(info.value)
        assert sorted(crashed) == [0, 1]
        gate.open()
        out = await pool.async_step_recv(min_get=2, timeout=WAIT)
        assert out["env_index"].tolist() == [2, 3]
        assert out["next", "observation"][:, 1].tolist() == [3.0, 4.0]
        await pool.async_step_send(actions([1], env_index=[0]))  # a dead actor answers at once
        with pytest.raises(EnvCrashedError):
            await pool.async_step_recv(timeout=WAIT)
        await pool.step(actions([5, 6], env_index=[2, 3]))  # the other actor still steps
    assert_gone([victim, *executor.pids], timeout=WAIT)


async def test_actor_unavailable_is_a_crash_never_a_retry(tmp_path) -> None:
    """Ray cannot tell whether the step ran: its envs get EnvCrashedError once, the actor is
    killed (it must not answer later), and with on_error="restart" a new one replaces it."""
    from ray.exceptions import ActorUnavailableError

    gate = Gate(str(tmp_path))
    executor = RayExecutor(num_workers=2)
    async with AsyncEnvPool(
        gated_env_fns(4, gate), executor=executor, on_error="restart", restart_backoff=0
    ) as pool:
        await pool.reset()
        worker = executor._worker_of[0]  # hosts envs 0 and 1
        old_pid = worker.pid
        await pool.async_step_send(actions([1, 2, 3, 4]))  # held at the gate: in flight
        unavailable: concurrent.futures.Future = concurrent.futures.Future()
        unavailable.set_exception(ActorUnavailableError("the actor is unreachable", None))
        executor._arrived(worker, CommandKind.STEP, [0, 1], executor._plan(worker, [0, 1]), unavailable)
        errors = []
        async with asyncio.timeout(WAIT):
            for _ in range(2):
                with pytest.raises(EnvCrashedError) as info:
                    await pool.async_step_recv(min_get=1)
                errors.append(info.value)
        assert sorted(e.env_index for e in errors) == [0, 1]
        assert all("ActorUnavailableError" in e.remote_traceback for e in errors)
        assert_gone([old_pid], timeout=WAIT)  # killed: it never answers (or steps) again
        gate.open()
        out = await pool.async_step_recv(min_get=2, timeout=WAIT)
        assert out["env_index"].tolist() == [2, 3]
        td = await pool.reset()  # waits for the restart of envs 0 and 1
        assert td["env_index"].tolist() == [0, 1, 2, 3]
        assert executor._worker_of[0].pid not in (0, old_pid)
        out = await pool.step(actions([1, 2, 3, 4]))
        assert out["next", "observation"][:, 2].tolist() == [1.0, 1.0, 1.0, 1.0]
        assert pool.stats().restarts == [1, 1, 0, 0]


async def test_close_with_a_step_hung_forever_is_bounded(tmp_path) -> None:
    gate = Gate(str(tmp_path))  # never opened
    executor = RayExecutor(num_workers=2, close_timeout=0.5)
    pool = AsyncEnvPool(gated_env_fns(4, gate), executor=executor)
    await pool.start()
    await pool.reset()
    pids = list(executor.pids)
    await pool.async_step_send(actions([1, 2, 3, 4]))
    async with asyncio.timeout(WAIT):  # close_timeout for the envs to close, then ray.kill
        await pool.aclose()
    assert actors_left() == []
    assert_gone(pids, timeout=WAIT)


async def test_close_kills_our_actors_only_and_leaves_ray_running() -> None:
    import ray

    @ray.remote
    class Bystander:
        def ping(self) -> str:
            return "pong"

    other = Bystander.options(name="bystander-of-the-test").remote()
    try:
        assert await other.ping.remote() == "pong"
        executor = RayExecutor(num_workers=2)
        async with AsyncEnvPool(echo_env_fns(3), executor=executor) as pool:
            await pool.reset()
            names = executor.actor_names
            assert sorted(actors_left()) == sorted(names)
        assert actors_left() == []
        assert ray.is_initialized()
        assert await other.ping.remote() == "pong"
    finally:
        ray.kill(other)  # pyright: ignore[reportArgumentType]


def test_a_pool_starts_ray_when_needed_and_shuts_down_what_it_started(tmp_path) -> None:
    """Without Ray running, the pool starts a local instance and the last pool to close shuts
    it down; its temporary directory goes with it (a fresh interpreter: one Ray per driver)."""
    script = textwrap.dedent(
        """
        import asyncio, glob, os, tempfile, ray
        from aenvs import AsyncEnvPool
        from aenvs.executors import RayExecutor
        where = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
        before = set(glob.glob(os.path.join(where, "aenvs-*")))

        async def main():
            pools = [AsyncEnvPool(["CartPole-v1"] * 2, executor=RayExecutor(init_options={"num_cpus": 1,
                     "include_dashboard": False, "address": "local"})) for _ in range(2)]
            for pool in pools:
                await pool.start()
            assert ray.is_initialized()
            td = await pools[0].reset()
            await pools[0].aclose()
            assert ray.is_initialized()   # the other pool still uses it
            await pools[1].reset()
            await pools[1].aclose()
            assert not ray.is_initialized()

        asyncio.run(main())
        after = set(glob.glob(os.path.join(where, "aenvs-*")))
        assert after <= before, after - before
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("AENVS_TEST_RAY_ZYGOTE", None)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT * 4, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_killed_driver_takes_the_ray_it_started_with_it(tmp_path) -> None:
    """The pool's process started Ray and is SIGKILLed with a step hung: every process of
    that Ray instance goes with it. GCS, raylet and actors at once; Ray's node agents first
    try to tell the (dead) GCS for up to 60 s (Ray's own timeout), then exit too: checked
    at the end of the session, so that no test waits for them."""
    script = textwrap.dedent(
        f"""
        import asyncio, psutil
        from aenvs import AsyncEnvPool
        from aenvs.testing import Fault, faulty_env_fns
        from tests.faults.support import echo_actions

        async def main():
            fns = faulty_env_fns(2, {{1: Fault("hang", at=1, release={str(tmp_path / "never")!r})}})
            async with AsyncEnvPool(fns, executor="ray", envs_per_worker=1) as pool:
                await pool.reset()
                await pool.async_step_send(echo_actions(2))
                await pool.async_step_recv(env_index=[0])
                print(*[p.pid for p in psutil.Process().children(recursive=True)], flush=True)
                await asyncio.Event().wait()   # killed here, env 1 still hung

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("RAY_ADDRESS", None)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        names = {p: psutil.Process(p).name() for p in pids}
        proc.kill()
        proc.wait(timeout=WAIT)
    agents = [p for p, name in names.items() if "Agent" in name]
    assert "gcs_server" in names.values() and "raylet" in names.values(), names
    assert sum("EnvHost" in name for name in names.values()) == 2, names  # our two actors
    assert_gone([p for p in pids if p not in agents], timeout=WAIT)
    LOCAL_RAY.expect_exit(agents, within=90)

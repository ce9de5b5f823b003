"""The pool's options reach the pool through the sync shim (``SerialEnv`` / ``ParallelEnv``)
and the gymnasium vector env, on every executor: one small test per group of options."""

from __future__ import annotations

import inspect
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from aenvs import AsyncEnvPool, EnvError, EnvState, ParallelEnv, RateLimit, SerialEnv
from aenvs._sync import BatchedEnv
from aenvs.gymnasium import AsyncVectorEnv
from aenvs.testing import Fault, faulty_env_fns
from tests.behaviour.limit_envs import ConcurrencyCounter, counting_env_fns
from tests.faults.deadline_envs import hanging_env_fns

pytestmark = pytest.mark.timeout(90)

# the pool's arguments the shim names otherwise, or builds itself
NOT_OPTIONS = {
    "env_fns",
    "num_envs",
    "num_workers",
    "executor",
    "envs_per_worker",
    "stack",
    "seed",
    "make_kwargs",
}


def test_the_shim_takes_every_pool_option_with_the_pool_default() -> None:
    pool = inspect.signature(AsyncEnvPool.__init__).parameters
    shim = inspect.signature(BatchedEnv.__init__).parameters
    options = [name for name in pool if name != "self" and name not in NOT_OPTIONS]
    assert options, "the pool has options"
    for name in options:
        assert name in shim, f"SerialEnv / ParallelEnv do not take the pool's {name!r}"
        assert shim[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert shim[name].default == pool[name].default, name
        assert shim[name].annotation == pool[name].annotation, name


def test_torchrl_only_options_are_still_checked() -> None:
    with SerialEnv(1, "CartPole-v1", shared_memory=True, mp_start_method="fork", max_concurrency=1) as env:
        assert env.num_envs == 1
    with pytest.raises(TypeError, match=r"got unexpected keyword arguments \['colour'\]"):
        SerialEnv(1, "CartPole-v1", colour="red")
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        SerialEnv(1, "CartPole-v1", max_concurrency=0)


def test_deadline_options_reach_the_pool(executor: str) -> None:
    deadline = 1.0  # the first step must come back within it, through a full GC of a loaded machine
    with ParallelEnv(
        3,
        hanging_env_fns(3, {}, "", asynchronous=False),
        executor=executor,
        episode_timeout=deadline,
        on_timeout="truncate",
        step_timeout=30.0,
        reset_timeout=30.0,
        startup_timeout=60.0,
        close_timeout=7.0,
    ) as env:
        assert (env.pool.executor.startup_timeout, env.pool.executor.close_timeout) == (60.0, 7.0)
        td = env.reset()
        since = time.perf_counter()
        td["action"] = torch.ones(3, dtype=torch.long)
        out = env.step(td)
        assert out["next", "timed_out"].flatten().tolist() == [False] * 3
        while time.perf_counter() - since < deadline:  # the clock itself: the deadline must pass
            time.sleep(deadline / 4)
        out = env.step(td)
        assert out["next", "timed_out"].flatten().tolist() == [True] * 3
        assert out["next", "truncated"].flatten().tolist() == [True] * 3
        assert env.stats().timeouts == [1, 1, 1]


def test_error_options_reach_the_pool(executor: str) -> None:
    # env 1 returns a NaN at its first step, and again after each rebuild
    fns = faulty_env_fns(2, {1: Fault("nan")})
    actions = {"action": torch.ones(2, 1, dtype=torch.float64)}
    with SerialEnv(
        2, fns, executor=executor, check_finite=True, on_error="restart", max_restarts=1, restart_backoff=0.0
    ) as env:
        env.reset()
        with pytest.raises(EnvError) as caught:
            env.step(env.reset().update(actions))
        assert caught.value.env_index == 1
        td = env.reset()  # waits for env 1's rebuild
        assert env.stats().restarts == [0, 1]
        with pytest.raises(EnvError):
            env.step(td.update(actions))
        assert env.stats().restarts == [0, 1]  # max_restarts=1: env 1 stays failed
        assert env.env_states[1] is EnvState.ERROR


def test_limit_options_reach_the_pool(executor: str, tmp_path) -> None:
    with SerialEnv(
        3, counting_env_fns(3, str(tmp_path), delay=0.02), executor=executor, max_concurrency=1
    ) as env:
        env.step(env.reset().update({"action": torch.ones(3, 1, dtype=torch.float64)}))
        assert ConcurrencyCounter(str(tmp_path)).read() == (0, 1)  # one env at a time
    quota = RateLimit(per_second=50.0, burst=1)
    with SerialEnv(2, "CartPole-v1", executor=executor, rate_limit=quota) as env:
        env.reset()  # the second env waits ~20 ms for its token
        assert env.stats().limit_wait_seconds > 0


def test_the_vector_env_passes_pool_options_through(executor: str, tmp_path) -> None:
    envs = AsyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2,
        executor=executor,
        close_timeout=7.0,
        rate_limit=RateLimit(per_second=50.0, burst=1),
        max_concurrency=1,
    )
    try:
        assert envs.pool.executor.close_timeout == 7.0
        envs.reset(seed=0)
        envs.step(np.array([0, 1]))
        assert envs.pool.stats().limit_wait_seconds > 0
    finally:
        envs.close()


@pytest.mark.parametrize(
    "options", [{"episode_timeout": 1.0}, {"on_timeout": "truncate", "step_timeout": 1.0}]
)
def test_the_vector_env_refuses_deadlines_its_autoresets_would_escape(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="AsyncVectorEnv takes no episode_timeout nor on_timeout='truncate'"):
        AsyncVectorEnv([lambda: gym.make("CartPole-v1")], executor="inline", **options)  # type: ignore[arg-type]

"""Gymnasium envs in a pool: actions reach them as their spaces say, coroutine envs run."""

from __future__ import annotations

import asyncio
import copy
import functools
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from aenvs import EnvContext, EnvError
from aenvs._adapters import make_adapter
from aenvs._specs import action_reader

# -- actions in the action space's own dtypes ----------------------------------------------

NARROW_SPACES: dict[str, spaces.Space] = {
    "discrete": spaces.Discrete(5, start=-2, dtype=np.int32),
    "discrete8": spaces.Discrete(3, dtype=np.int8),
    "multidiscrete": spaces.MultiDiscrete([3, 4], dtype=np.int32),
}
NARROW_SPACES["nested"] = spaces.Dict(
    {
        "d": NARROW_SPACES["discrete8"],
        "m": NARROW_SPACES["multidiscrete"],
        "t": spaces.Tuple(
            (
                spaces.Discrete(4, start=-2, dtype=np.int16),
                spaces.MultiDiscrete(np.array([[2, 3]]), dtype=np.uint8),
            )
        ),
    }
)


def leaf_values(space: spaces.Space, value: Any) -> list[tuple[np.dtype, np.ndarray]]:
    """Each leaf of ``value`` (laid out as ``space``) with the dtype the env got it in."""
    if isinstance(space, spaces.Dict):
        return [leaf for k, sub in space.spaces.items() for leaf in leaf_values(sub, value[k])]
    if isinstance(space, spaces.Tuple):
        return [leaf for sub, v in zip(space.spaces, value, strict=True) for leaf in leaf_values(sub, v)]
    array = np.asarray(value)
    return [(array.dtype, array.ravel())]


class NarrowActionsEnv(gym.Env):
    """Checks that its action is in its action space, in exactly the space's dtypes, and
    echoes the action's values as its observation."""

    metadata: ClassVar[dict[str, Any]] = {}

    def __init__(self, space: str) -> None:
        self.action_space = copy.deepcopy(NARROW_SPACES[space])  # its own: envs may run in threads
        self.size = sum(v.size for _, v in leaf_values(self.action_space, self.action_space.sample()))
        self.observation_space = spaces.Box(-10, 10, (self.size,), np.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(self.size, np.float64), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert action in self.action_space, f"{action!r} not in {self.action_space}"
        leaves = leaf_values(self.action_space, action)
        expected = [np.dtype(s.dtype) for s in _leaf_spaces(self.action_space)]
        assert [dtype for dtype, _ in leaves] == expected, f"{action!r} is not in the dtypes {expected}"
        obs = np.concatenate([v.astype(np.float64) for _, v in leaves])
        return obs, 0.0, False, False, {}


def _leaf_spaces(space: spaces.Space) -> list[spaces.Space]:
    if isinstance(space, spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaf_spaces(sub)]
    if isinstance(space, spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaf_spaces(sub)]
    return [space]


def flat_actions(td: Any) -> torch.Tensor:
    """The action entries of a batch, flattened per env in the space's key order."""
    action = td["action"]
    if isinstance(action, torch.Tensor):
        return action.reshape(action.shape[0], -1).to(torch.float64)
    parts = [action.get(key) for key in action.keys(include_nested=True, leaves_only=True, sort=False)]
    return torch.cat([p.reshape(p.shape[0], -1).to(torch.float64) for p in parts], dim=1)


@pytest.mark.parametrize("space", list(NARROW_SPACES))
async def test_discrete_actions_reach_the_env_in_the_space_dtype(make_pool, space: str) -> None:
    pool = await make_pool([functools.partial(NarrowActionsEnv, space)] * 3)
    assert all(leaf.dtype == np.int64 for spec in pool.env_specs for leaf in spec.action_leaves)
    td = await pool.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        td = pool.rand_action(td, generator=generator)
        out = await pool.step(td)  # an EnvError if an action is not in its space, in its dtypes
        assert torch.equal(out["next", "observation"], flat_actions(td))


class ActionTypeEnv(gym.Env):
    """Keeps the type of the last action it got (``last_action_type``)."""

    metadata: ClassVar[dict[str, Any]] = {}
    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self) -> None:
        self.last_action_type = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.last_action_type = f"{type(action).__module__}.{type(action).__qualname__}"
        return np.zeros(1, np.float32), 0.0, False, False, {}


async def test_a_discrete_action_reaches_the_env_as_gymnasium_vector_envs_hand_it(make_pool) -> None:
    """A numpy scalar, not a Python int: what gymnasium's vector envs give an env's step."""
    reference = gym.vector.SyncVectorEnv([ActionTypeEnv] * 2)
    reference.reset(seed=0)
    reference.step(np.array([1, 2]))
    expected = list(reference.get_attr("last_action_type"))
    reference.close()
    pool = await make_pool([ActionTypeEnv] * 2)
    td = await pool.reset()
    td["action"] = torch.tensor([1, 2])
    await pool.step(td)
    assert await pool.get_attr("last_action_type") == expected == ["numpy.int64"] * 2


def test_an_action_the_dtype_cannot_hold_is_not_wrapped_around() -> None:
    """300 as int8 would be 44, a valid action: the env gets the value as sent and refuses it."""
    space = spaces.Dict(
        {"d": spaces.Discrete(3, dtype=np.int8), "m": spaces.MultiDiscrete([3, 3], dtype=np.int8)}
    )
    buffers = {("action", "d"): np.array([300, 2]), ("action", "m"): np.array([[1, 300], [2, 0]])}
    read = action_reader(space, buffers)
    bad, good = read(0), read(1)
    assert bad["d"] == 300 and bad["m"].tolist() == [1, 300] and bad not in space
    assert good in space and good["d"].dtype == np.int8 and good["m"].dtype == np.int8


# -- coroutine envs (async def step / reset) -------------------------------------------------

COROUTINE_ID = "aenvs-tests/Coroutine-v0"


class BaseExceptionEnv(gym.Env):
    """Observes its last action; action 2 raises CancelledError (a BaseException) in its step."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        if action == 2:
            raise asyncio.CancelledError("raised by the env itself")
        return np.full(1, action, np.float32), 0.0, False, False, {}


async def test_an_env_raising_a_base_exception_fails_alone_among_its_workers_envs(make_pool) -> None:
    pool = await make_pool([BaseExceptionEnv] * 3, envs_per_worker=3)  # one worker hosts all three
    await pool.reset()
    await pool.async_step_send(TensorDict(action=torch.tensor([1, 2, 1]), batch_size=[3]))
    with pytest.raises(EnvError) as info:
        await pool.async_step_recv(min_get=3)
    assert (info.value.env_index, info.value.exc_type) == (1, "asyncio.exceptions.CancelledError")
    out = await pool.async_step_recv(min_get=2)  # its neighbours stepped as usual
    assert out["env_index"].tolist() == [0, 2]
    assert out["next", "observation"].flatten().tolist() == [1.0, 1.0]


class CoroutineEnv(gym.Env):
    """``async def`` reset and step that really suspend; the observation is (t, action, resets)
    and an episode ends (terminated) after ``length`` steps."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    observation_space = spaces.Box(-1000, 1000, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, length: int = 100, obs_scale: float = 1.0) -> None:
        self.length = length
        self.obs_scale = obs_scale  # > 1: observations out of the space (the passive checker warns)
        self.t = 0
        self.resets = 0

    def _obs(self, action: int = 0) -> np.ndarray:
        return np.array([self.t, action, self.resets], np.float32) * self.obs_scale

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]:
        super().reset(seed=seed)
        await asyncio.sleep(0)
        self.t = 0
        self.resets += 1
        return self._obs(), {"seeded": seed is not None}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        await asyncio.sleep(0)
        assert action in self.action_space, action
        self.t += 1
        return self._obs(int(action)), 0.5 * self.t, self.t >= self.length, False, {"t": self.t}

    async def double(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x


if COROUTINE_ID not in gym.registry:
    gym.register(COROUTINE_ID, entry_point=f"{__name__}:CoroutineEnv", max_episode_steps=3)


def make_registered(**kwargs: Any) -> gym.Env:
    """``gym.make`` of the coroutine env: TimeLimit(3), OrderEnforcing and PassiveEnvChecker
    around it (a function of this module, so that worker processes import the registration)."""
    return gym.make(COROUTINE_ID, **kwargs)


def make_wrapped(wrapper: str) -> gym.Env:
    env = CoroutineEnv()
    if wrapper == "record_stats":
        return gym.wrappers.RecordEpisodeStatistics(env)
    if wrapper == "async_over_time_limit":
        return AsyncScale(gym.wrappers.TimeLimit(env, 3))
    raise AssertionError(wrapper)


class AsyncScale(gym.Wrapper):
    """A user's own coroutine wrapper: doubles the reward."""

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:  # type: ignore[override]
        env: Any = self.env  # a coroutine env
        obs, reward, terminated, truncated, info = await env.step(action)
        return obs, 2 * reward, terminated, truncated, info


def discrete_actions(values: list[int]) -> TensorDict:
    return TensorDict(action=torch.tensor(values), batch_size=[len(values)])


async def test_a_coroutine_gymnasium_env_steps_and_resets(make_pool) -> None:
    pool = await make_pool([functools.partial(CoroutineEnv, length=2)] * 3, seed=0)
    td = await pool.reset()
    assert td["observation"].tolist() == [[0, 0, 1]] * 3
    out = await pool.step(discrete_actions([0, 1, 2]))
    assert out["next", "observation"].tolist() == [[1, 0, 1], [1, 1, 1], [1, 2, 1]]
    assert out["next", "reward"].squeeze(-1).tolist() == [0.5] * 3
    assert out["next", "info", "t"].tolist() == [1] * 3
    out, td = await pool.step_and_maybe_reset(discrete_actions([2, 2, 2]))
    assert out["next", "terminated"].all() and td["observation"].tolist() == [[0, 0, 2]] * 3
    assert await pool.call("double", 21) == [42] * 3
    assert await pool.get_attr("resets") == [2] * 3


class OverlappingEnv(CoroutineEnv):
    """Its step returns only once every env of its worker is inside a step at the same time:
    coroutine envs of one worker must run concurrently (else this raises after 10 s)."""

    rounds: ClassVar[dict[tuple[int, int], list[Any]]] = {}

    def __init__(self, context: EnvContext) -> None:
        super().__init__()
        self.together = context.num_envs

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        key = (id(asyncio.get_running_loop()), self.t)
        inside = self.rounds.setdefault(key, [0, asyncio.Event()])
        inside[0] += 1
        if inside[0] == self.together:
            inside[1].set()
        try:
            await asyncio.wait_for(inside[1].wait(), 10)
        except TimeoutError:
            raise RuntimeError(
                f"only {inside[0]} of {self.together} envs were inside step together"
            ) from None
        return await super().step(action)


async def test_coroutine_envs_of_a_worker_overlap(make_pool) -> None:
    n = 8
    pool = await make_pool([OverlappingEnv] * n, envs_per_worker=n)
    await pool.reset()
    for t in (1, 2):
        out = await pool.step(discrete_actions([1] * n))
        assert out["next", "observation"][:, 0].tolist() == [t] * n


async def test_gym_make_wrappers_apply_around_a_coroutine_env(make_pool) -> None:
    """TimeLimit truncates, OrderEnforcing and the passive checker let it through."""
    pool = await make_pool([make_registered] * 2)
    td = await pool.reset()
    flags = []
    for _ in range(3):
        td["action"] = torch.tensor([1, 1])
        out, td = await pool.step_and_maybe_reset(td)
        flags.append((out["next", "terminated"].any().item(), out["next", "truncated"].all().item()))
    assert flags == [(False, False), (False, False), (False, True)]
    assert td["observation"].tolist() == [[0, 0, 2]] * 2  # reset after the truncation
    assert await pool.get_attr("_elapsed_steps") == [0, 0]
    out = await pool.step(discrete_actions([1, 1]))
    assert out["next", "observation"][:, 0].tolist() == [1.0, 1.0]
    assert await pool.get_attr("_elapsed_steps") == [1, 1]


class AsyncDelay(gym.Wrapper):
    """A user's own coroutine wrapper around a plain env: waits before each step."""

    async def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.env.step(action)


async def test_user_coroutine_wrappers_run(make_pool) -> None:
    pool = await make_pool([lambda: AsyncScale(CoroutineEnv()), lambda: AsyncDelay(gym.make("CartPole-v1"))])
    await pool.reset()
    out = await pool.step(discrete_actions([1, 1]))
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0]
    assert out[0]["next", "observation"].tolist() == [1.0, 1.0, 1.0]  # (t, action, resets)


@pytest.mark.parametrize(
    ("wrapper", "match"),
    [
        ("record_stats", "RecordEpisodeStatistics.step is synchronous"),
        ("async_over_time_limit", "TimeLimit.step is synchronous"),
    ],
)
async def test_a_sync_wrapper_aenvs_cannot_run_around_a_coroutine_env_is_refused(
    make_pool, wrapper: str, match: str
) -> None:
    with pytest.raises(EnvError, match=match) as caught:
        await make_pool([functools.partial(make_wrapped, wrapper)])
    assert caught.value.command == "make" and "async def" in str(caught.value)


async def test_gymnasium_wrappers_around_a_coroutine_env_as_around_a_plain_one() -> None:
    """Order enforcing, the passive checker's warnings and the hook wrappers (observation,
    reward, action) behave as they do around a plain env."""
    adapter = make_adapter(make_registered())
    assert adapter.is_async
    buffers = {("action",): np.array([1])}
    with pytest.raises(gym.error.ResetNeeded):
        await adapter.step(buffers, 0)
    adapter.outcome(await adapter.reset(0, None), False)

    adapter = make_adapter(make_registered(obs_scale=1e6))  # observations out of their space
    with pytest.warns(UserWarning, match="not within the observation space"):
        adapter.outcome(await adapter.reset(None, None), False)
    with pytest.warns(UserWarning, match="not within the observation space"):
        adapter.outcome(await adapter.step(buffers, 0), True)
    adapter.outcome(await adapter.step(buffers, 0), True)  # checked once, as gymnasium does

    env = gym.wrappers.TransformObservation(
        CoroutineEnv(), lambda obs: obs + 10, CoroutineEnv.observation_space
    )
    env = gym.wrappers.TransformReward(env, lambda r: -float(r))
    env = gym.wrappers.TransformAction(env, lambda a: 2 - a, spaces.Discrete(3))
    adapter = make_adapter(env)
    assert adapter.outcome(await adapter.reset(None, None), False).items[0][1].tolist() == [10, 10, 11]
    step = adapter.outcome(await adapter.step(buffers, 0), True)
    assert step.items[0][1].tolist() == [11, 11, 11] and step.reward == -0.5


async def test_a_sync_step_returning_a_coroutine_is_a_clear_error() -> None:
    class Undeclared(CoroutineEnv):
        def step(self, action: Any) -> Any:  # type: ignore[override]
            return CoroutineEnv.step(self, action)

        def reset(self, **kwargs: Any) -> Any:  # type: ignore[override]
            return CoroutineEnv.reset(self, **kwargs)

    adapter = make_adapter(Undeclared())
    assert not adapter.is_async
    with pytest.raises(TypeError, match=r"Undeclared.reset returned a coroutine.*async def"):
        adapter.reset(None, None)
    with pytest.raises(TypeError, match=r"Undeclared.step returned a coroutine.*async def"):
        adapter.step({("action",): np.array([1])}, 0)

"""TorchRL's indexed views (``env[idx]``) and attribute forwarding (``env.attr``) of a batched
env, through the :class:`~aenvs._torchrl_batched.views.BatchedViews` mixin, on every executor.

The env under test is a tiny stand-in: :class:`~aenvs.torchrl.AenvsWrapper` over an
:class:`aenvs.SerialEnv` with the mixin, routing its pool calls through ``worker_indices``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import aenvs
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl


class _Nested:
    def __init__(self) -> None:
        self.value = 42

    def get_value(self) -> int:
        return self.value


class CounterEnv(gym.Env[np.ndarray, np.int64]):
    """Counts its steps (``counter``, also the observation); ``nested.value`` is 42."""

    observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, start: int = 0) -> None:
        self.counter = start
        self.custom_attr = 1
        self.nested = _Nested()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.counter = 0
        return np.array([0], np.float32), {}

    def step(self, action: int) -> Any:
        self.counter += 1
        return np.array([self.counter], np.float32), 1.0, False, False, {}

    def custom_fun(self, x: int = 0) -> int:
        return x

    @property
    def custom_prop(self) -> int:
        return 2


def _stand_in(num: int, executor: str, **kwargs: Any) -> Any:
    """An EnvBase over an aenvs SerialEnv with the views mixin (what G1's classes do)."""
    import_torchrl()
    from aenvs._torchrl_batched.views import BatchedViews
    from aenvs.torchrl import AenvsWrapper

    class StandIn(BatchedViews, AenvsWrapper):
        def __init__(self) -> None:
            AenvsWrapper.__init__(self, aenvs.SerialEnv(num, CounterEnv, kwargs or None, executor=executor))
            self.num_workers = num
            self.create_env_kwargs = [dict(kwargs) for _ in range(num)]
            self.is_closed = False

        @property
        def pool(self) -> Any:
            return self.env.pool

        def _run(self, fn: Any, *args: Any, **kw: Any) -> Any:
            return self.env._run(fn, *args, **kw)  # pyright: ignore[reportPrivateUsage]

        def _reset(self, tensordict: Any, **kw: Any) -> Any:
            self.check_view()
            out = self._run(self.pool.reset, env_index=self.worker_indices)
            return out.select(*self._reset_keys)

        def _step(self, tensordict: Any) -> Any:
            self.check_view()
            td = tensordict.select(*self._action_keys)
            out = self._run(self.pool.step, td, self.worker_indices)
            return out["next"].select(*self._step_keys)

        def close(self, *, raise_if_closed: bool = True) -> None:
            if self.is_view:
                self.close_view()
            else:
                AenvsWrapper.close(self, raise_if_closed=raise_if_closed)

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_") or "_env" not in self.__dict__:
                return AenvsWrapper.__getattr__(self, name)
            return self.forward_attr(name)

    return StandIn()


def _counts(env: Any) -> list[int]:
    return list(env.counter)


@pytest.mark.parametrize(
    ("item", "selected"),
    [(2, [2]), (-1, [3]), (slice(1, 3), [1, 2]), (np.array([0, 3]), [0, 3]), (torch.tensor([1, 3]), [1, 3])],
)
def test_an_indexed_env_is_a_live_view_of_those_workers(
    executor: str, item: Any, selected: list[int]
) -> None:
    env = _stand_in(4, executor)
    try:
        env.reset()
        view = env[item]
        assert type(view) is type(env)
        assert view.num_workers == len(selected)
        assert view.batch_size == torch.Size([len(selected)])
        assert view.full_action_spec.shape == torch.Size([len(selected)])
        out = view.step(view.full_action_spec.zero())
        assert out["next", "observation"].shape == (len(selected), 1)
        assert _counts(env) == [int(i in selected) for i in range(4)]
        assert _counts(view) == [1] * len(selected)
        view.close()
        assert view.is_closed and not env.is_closed
        env.rand_step()  # the parent runs on
        with pytest.raises(RuntimeError, match="closed indexed"):
            view.reset()
    finally:
        env.close(raise_if_closed=False)


def test_a_view_of_a_view_and_of_a_closed_parent(executor: str) -> None:
    env = _stand_in(4, executor)
    env.reset()
    view = env[1:][-1]  # worker 3
    assert view.worker_indices == [3]
    view.rand_step()
    assert _counts(env) == [0, 0, 0, 1]
    env.close()
    with pytest.raises(RuntimeError, match="parent environment has been closed"):
        view.reset()


@pytest.mark.parametrize("item", [np.ones(4, dtype=bool), torch.ones(4, dtype=torch.bool), True])
def test_bool_masks_are_refused_as_torchrl_does(item: Any) -> None:
    env = _stand_in(4, "inline")
    try:
        env.reset()
        with pytest.raises(NotImplementedError, match="Boolean masks"):
            env[item]
        with pytest.raises(IndexError, match="out of bounds"):
            env[4]
        with pytest.raises(IndexError, match="Empty"):
            env[4:]
    finally:
        env.close()


def test_attributes_are_forwarded_per_worker(executor: str) -> None:
    env = _stand_in(2, executor)
    try:
        env.reset()
        assert env.custom_attr == [1, 1]
        assert env.custom_prop == [2, 2]
        assert env.custom_fun(3) == [3, 3]
        assert list(env.nested.value) == [42, 42]  # chained, as TorchRL's dispatch
        assert env.nested.get_value() == [42, 42]
        assert env[1].custom_fun(5) == [5]
        with pytest.raises(AttributeError, match="not found"):
            env.no_such_thing  # noqa: B018
    finally:
        env.close()


def test_update_kwargs_checks_the_worker_count() -> None:
    env = _stand_in(2, "inline", start=3)
    try:
        env.update_kwargs({"start": 5})
        assert env.create_env_kwargs == [{"start": 5}, {"start": 5}]
        env.update_kwargs([{"start": 1}, {"start": 2}])
        assert env.create_env_kwargs == [{"start": 1}, {"start": 2}]
        with pytest.raises(RuntimeError, match=r"len\(kwargs\) and num_workers mismatch"):
            env.update_kwargs([{"start": 42}])
    finally:
        env.close()


def test_writeback_of_a_snapshot_env(executor: str) -> None:
    """``env[idx] = source``: the worker's env takes ``env[:] = source``; an env that cannot
    raises NotImplementedError (a gymnasium env has no snapshot writeback)."""
    envs = import_torchrl("torchrl.envs")
    env = _stand_in(2, executor)
    try:
        env.reset()
        with pytest.raises(NotImplementedError, match="snapshot writeback"):
            env[0] = envs.PendulumEnv()
        with pytest.raises(ValueError, match="source count"):
            env[0] = [envs.PendulumEnv(), envs.PendulumEnv()]
        with pytest.raises(TypeError, match="EnvBase"):
            env[0] = 3
    finally:
        env.close()

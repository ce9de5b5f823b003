"""Stable-Baselines3's vector API on an :class:`~aenvs.AsyncEnvPool`: :class:`VecEnv`.

Needs the ``sb3`` extra (``pip install aenvs[sb3]``). A real
``stable_baselines3.common.vec_env.VecEnv``, to pass where SB3 takes ``SubprocVecEnv`` or
``DummyVecEnv``: to ``PPO``, under ``VecNormalize``, ``VecMonitor``, ``VecFrameStack``.

It is an :class:`aenvs.gymnasium.AsyncVectorEnv` in gymnasium's ``SAME_STEP`` autoreset
mode (an ended episode is reset inside the worker, in the step's round trip, as SB3's
workers do), with its returns reshaped into SB3's: ``done`` flags, a list of info dicts
(``terminal_observation``, ``TimeLimit.truncated``), ``reset_infos``, and seeds and options
applied at the next :meth:`VecEnv.reset`. Each env's info reaches the list as the env gave
it: the vector env hands each one over untouched instead of batching it.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.error import NoAsyncCallError
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

try:
    from stable_baselines3.common import vec_env as _sb3_vec_env
    from stable_baselines3.common.env_util import is_wrapped
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise ImportError(
        "aenvs.sb3 needs Stable-Baselines3 (stable-baselines3>=2.3): pip install 'aenvs[sb3]'"
    ) from exc

from aenvs._adapters.building import build_env
from aenvs._errors import EnvError
from aenvs.gymnasium import AsyncVectorEnv

if TYPE_CHECKING:
    from aenvs._env import EnvContext, EnvFn
    from aenvs._loop import DriverKind
    from aenvs.executors import Executor

__all__ = ["VecEnv"]

StepReturn = tuple[Any, npt.NDArray[np.float32], npt.NDArray[np.bool_], list[dict[str, Any]]]
"""Observations, rewards, dones and one info dict per env."""
Indices = int | Iterable[int] | None
"""SB3's ``VecEnvIndices``: None (every env), one index, or several."""


class VecEnv(_sb3_vec_env.VecEnv):
    """A Stable-Baselines3 ``VecEnv`` whose envs run on an aenvs executor.

    Drop-in for ``SubprocVecEnv`` (the default executor is ``"process"``) and
    ``DummyVecEnv`` (``executor="inline"``), with SB3's semantics: an ended episode is
    reset at once, its last observation in ``infos[i]["terminal_observation"]`` and its
    reset's info in :attr:`reset_infos`; ``seed()`` and ``set_options()`` apply at the next
    :meth:`reset`; Dict and Tuple observations come as a dict or tuple of arrays.

    Args:
        env_fns: zero-argument callables returning gymnasium envs, as SB3 takes them (or
            gymnasium ids, or callables taking an :class:`~aenvs.EnvContext`).
        executor: ``"inline"``, ``"thread"``, ``"process"`` (default), ``"ray"`` or an
            :class:`~aenvs.executors.Executor`.
        envs_per_worker: how many envs each worker hosts (default: the executor's choice).
        num_workers: how many workers the executor starts (default: the executor's choice).
        loop: the loop driver (``"auto"``, ``"private"``, ``"portal"``), as for
            :class:`~aenvs.SerialEnv`.
        **pool_options: further :class:`~aenvs.AsyncEnvPool` options (``on_error``,
            ``step_timeout``...), as for :class:`aenvs.gymnasium.AsyncVectorEnv`.

    Rewards come as float32 and dones as bool arrays, as ``DummyVecEnv`` gives them. An
    env's error surfaces as :class:`~aenvs.EnvError`.

    Example:
        >>> import gymnasium as gym
        >>> from aenvs.sb3 import VecEnv
        >>> envs = VecEnv([lambda: gym.make("CartPole-v1")] * 4, executor="thread")
        >>> envs.seed(0)
        [0, 1, 2, 3]
        >>> obs = envs.reset()
        >>> obs, rewards, dones, infos = envs.step(np.array([0, 1, 0, 1]))
        >>> obs.shape, rewards.dtype, dones.dtype, infos[0]
        ((4, 4), dtype('float32'), dtype('bool'), {'TimeLimit.truncated': False})
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        executor: str | Executor = "process",
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        loop: DriverKind = "auto",
        **pool_options: Any,
    ) -> None:
        built = _Built()
        self._envs = _Members(
            [functools.partial(_build, env_fn=fn, built=built) for fn in env_fns],
            autoreset_mode=AutoresetMode.SAME_STEP,
            executor=executor,
            envs_per_worker=envs_per_worker,
            num_workers=num_workers,
            loop=loop,
            **pool_options,
        )
        try:
            super().__init__(  # pyright: ignore[reportUnknownMemberType] (SB3's bare Space)
                self._envs.num_envs, self._envs.single_observation_space, self._envs.single_action_space
            )
        except BaseException:
            self._envs.close()
            raise
        self._actions: Any = None

    @property
    def vector_env(self) -> AsyncVectorEnv:
        """The :class:`aenvs.gymnasium.AsyncVectorEnv` underneath (its ``pool`` is the
        :class:`~aenvs.AsyncEnvPool`)."""
        return self._envs

    def reset(self) -> Any:
        """Reset every env with the seeds of :meth:`seed` and the options of
        :meth:`set_options` (each used once); return the observations.

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> envs.seed(7)
            [7, 8]
            >>> envs.reset().shape
            (2, 4)
            >>> envs.close()
        """
        self._actions = None
        # SB3 keeps options per env: envs with equal options are reset together (usually all)
        groups: list[tuple[dict[str, Any], list[int]]] = []
        for i, options in enumerate(self._options):
            rows = next((rows for held, rows in groups if held == options), None)
            if rows is None:
                groups.append((options, [i]))
            else:
                rows.append(i)
        obs: Any = None
        for options, rows in groups:
            given: dict[str, Any] | None = dict(options) or None  # SB3 passes no empty options
            if len(rows) < self.num_envs:
                given = {**(given or {}), "reset_mask": np.isin(np.arange(self.num_envs), rows)}
            obs, infos = self._envs.reset(seed=list(self._seeds), options=given)
            for i in rows:
                self.reset_infos[i] = _per_env(infos).get(i, {})
        self._reset_seeds()
        self._reset_options()
        return obs

    def step(self, actions: Any) -> StepReturn:
        """:meth:`step_async` then :meth:`step_wait`, as SB3's ``VecEnv.step`` (typed for these returns).

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> obs = envs.reset()
            >>> obs, rewards, dones, infos = envs.step(np.array([0, 1]))
            >>> dones
            array([False, False])
            >>> envs.close()
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Keep one action per env (``actions``: a batch of the action space) for :meth:`step_wait`.

        The step is sent by :meth:`step_wait`, as ``DummyVecEnv`` does (SB3's algorithms
        call the two back to back): one pool step with its results read as columns costs
        less than a send and a receive made apart.

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> obs = envs.reset()
            >>> envs.step_async(np.array([0, 1]))
            >>> obs, rewards, dones, infos = envs.step_wait()
            >>> envs.close()
        """
        space: spaces.Space[Any] = self._envs.single_action_space
        if isinstance(space, spaces.Dict | spaces.Tuple) and not isinstance(actions, Mapping):
            # SB3 indexes the actions per env (a list of dicts); gymnasium takes a batch per part
            per_env = list(cast("Iterable[Any]", actions))
            if len(per_env) != self.num_envs:
                raise ValueError(f"step_async takes {self.num_envs} actions, one per env, got {len(per_env)}")
            actions = concatenate(space, per_env, create_empty_array(space, self.num_envs))
        self._actions = actions

    def step_wait(self) -> StepReturn:
        """Step every env with the actions of :meth:`step_async`; return observations,
        rewards, dones and infos.

        An env whose episode ended was reset in the same step: its observation is the new
        episode's first, the last one is ``infos[i]["terminal_observation"]``, and its
        reset's info is ``reset_infos[i]``.
        """
        actions, self._actions = self._actions, None
        if actions is None:
            raise NoAsyncCallError("Calling `step_wait` without any prior call to `step_async`.", "step")
        obs, rewards, terminated, truncated, vector_infos = self._envs.step(actions)
        dones = terminated | truncated
        timeouts: list[bool] = (truncated & ~terminated).tolist()
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": flag} for flag in timeouts]
        for i, given in _per_env(vector_infos).items():  # the envs that gave an info (few)
            info = dict(given)
            if dones[i]:  # SAME_STEP: the reset's info, the ended episode's beside it
                last, final = info.pop("final_obs"), info.pop("final_info")
                self.reset_infos[i] = info
                infos[i] = {**final, "TimeLimit.truncated": timeouts[i], "terminal_observation": last}
            else:
                infos[i] = {**info, "TimeLimit.truncated": timeouts[i]}
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Stop every worker the envs run in (idempotent).

        Example:
            >>> VecEnv(["CartPole-v1"], executor="inline").close()
        """
        self._envs.close()

    def get_attr(self, attr_name: str, indices: Indices = None) -> list[Any]:
        """Attribute ``attr_name`` of each env of ``indices`` (default all), found through its wrappers.

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> envs.get_attr("gravity", indices=[1])
            [9.8]
            >>> envs.close()
        """
        try:
            return self._run(self._envs.pool.get_attr, attr_name, env_index=self._rows(indices))
        except EnvError as exc:
            if exc.exc_type != "builtins.AttributeError":
                raise
            raise AttributeError(exc.message) from exc  # SB3's has_attr and wrappers rely on it

    def set_attr(self, attr_name: str, value: Any, indices: Indices = None) -> None:
        """Set attribute ``attr_name`` of each env of ``indices`` (default all) to ``value``.

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> envs.set_attr("gravity", 1.6, indices=0)
            >>> envs.get_attr("gravity")
            [1.6, 9.8]
            >>> envs.close()
        """
        self._run(self._envs.pool.set_attr, attr_name, value, env_index=self._rows(indices))

    def env_method(
        self, method_name: str, *method_args: Any, indices: Indices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call method ``method_name`` of each env of ``indices`` (default all); one result per env.

        Example:
            >>> envs = VecEnv(["CartPole-v1"] * 2, executor="inline")
            >>> envs.env_method("get_wrapper_attr", "gravity")
            [9.8, 9.8]
            >>> envs.close()
        """
        rows = self._rows(indices)
        # aenvs_call: from the user's outermost wrapper in, past the autoreset wrapper
        return self._run(
            self._envs.pool.call, "aenvs_call", method_name, method_args, method_kwargs, env_index=rows
        )

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: Indices = None
    ) -> list[bool]:
        """Whether each env of ``indices`` (default all) is wrapped in ``wrapper_class``.

        Example:
            >>> from gymnasium.wrappers import TimeLimit
            >>> envs = VecEnv(["CartPole-v1"], executor="inline")
            >>> envs.env_is_wrapped(TimeLimit)
            [True]
            >>> envs.close()
        """
        return self.env_method("aenvs_sb3_is_wrapped", wrapper_class, indices=indices)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame (``render_mode="rgb_array"``; else Nones, with SB3's warning).

        Example:
            >>> envs = VecEnv([lambda: gym.make("CartPole-v1", render_mode="rgb_array")], executor="inline")
            >>> _ = envs.reset()
            >>> envs.get_images()[0].shape
            (400, 600, 3)
            >>> envs.close()
        """
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` "
                "to obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self.env_method("render")

    def _rows(self, indices: Indices) -> list[int]:
        n = self.num_envs
        return [i + n if -n <= i < 0 else i for i in self._get_indices(indices)]  # -1: the last, as in SB3

    def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._envs.run(method, *args, **kwargs)


class _Members(AsyncVectorEnv):
    """The vector env underneath: its infos are each env's own, by env index, not batched."""

    def __repr__(self) -> str:  # named in the warning of an instance dropped unclosed
        return f"aenvs.sb3.VecEnv(num_envs={self.num_envs})"

    def _add_info(
        self, vector_infos: dict[Any, Any], env_info: dict[str, Any], env_num: int
    ) -> dict[Any, Any]:
        vector_infos[env_num] = env_info
        return vector_infos

    def run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a pool coroutine on this vector env's loop driver."""
        self._assert_is_running()
        return self._driver.run(method, *args, **kwargs)


def _per_env(infos: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The infos of :class:`_Members`: each env's own, by env index (for the envs that gave one)."""
    return cast("dict[int, dict[str, Any]]", infos)


class _Sb3Wrapper(gym.Wrapper[Any, Any, Any, Any]):
    """Around each env, in its worker: answers :meth:`VecEnv.env_is_wrapped` there."""

    def aenvs_sb3_is_wrapped(self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]]) -> bool:
        return is_wrapped(self.env, wrapper_class)


class _Built:
    """The envs a vector env's factories built in one process (a worker, or the caller's), to
    refuse a factory that returns an env built before: two envs of the vector env would be one.

    Pickled empty: each worker process gets its own (shared by the factories it unpickles).
    """

    def __init__(self) -> None:
        self.envs: weakref.WeakSet[gym.Env[Any, Any]] = weakref.WeakSet()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Built, ())


def _build(context: EnvContext, *, env_fn: EnvFn, built: _Built) -> gym.Env[Any, Any]:
    env = build_env(env_fn, context)
    if not isinstance(env, gym.Env):
        raise TypeError(
            f"env {context.env_index}: aenvs.sb3.VecEnv runs gymnasium envs, but the factory returned "
            f"{type(env).__name__}"
        )
    inner = cast("gym.Env[Any, Any]", env).unwrapped
    if inner in built.envs:
        raise ValueError(
            f"env {context.env_index}: its factory returned an env that another factory returned too; "
            "each factory must make a new env (gym.make(...) inside it, not `lambda: env`)"
        )
    built.envs.add(inner)
    return _Sb3Wrapper(cast("gym.Env[Any, Any]", env))

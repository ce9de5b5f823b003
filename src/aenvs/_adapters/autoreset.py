"""Gymnasium's autoreset modes, applied inside the workers to each env of an AsyncVectorEnv.

The pool's own auto-reset (``step_and_maybe_reset``) resets an ended episode in the same
round trip; gymnasium's vector API defines three modes of its own (NEXT_STEP, SAME_STEP,
DISABLED) and returns infos and rewards as the env gave them. :class:`Member` wraps each
env so that it behaves as gymnasium's vector envs say, wherever the pool runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from aenvs._adapters.building import build_env
from aenvs._adapters.gym_async import AsyncMethod, lifted, register_lift
from aenvs._env import EnvContext, EnvFn

__all__ = ["Carry", "Member", "build_member", "make_from_id"]


class Carry:
    """What a member sends beside the pool's layout: its raw info, and a float64 reward.

    The pool stores rewards as float32 and infos as tensors; a vector env must return
    them as the env gave them. A member returns a ``Carry`` as its info only when there
    is something to carry, so the steps that have nothing (most, for most envs) cost
    nothing extra.
    """

    __slots__ = ("info", "reward")

    def __init__(self, info: dict[str, Any], reward: float | None = None) -> None:
        self.info = info
        self.reward = reward

    def __reduce__(self) -> tuple[Any, ...]:
        return (Carry, (self.info, self.reward))


_EXACT = float(2**24)  # every whole number of at most this magnitude is exact in float32


def _carry(info: dict[str, Any], reward: Any = None) -> Any:
    exact = None
    if reward is not None:
        value = float(reward)
        # whole numbers up to 2**24 (most rewards) are float32's exactly: no numpy scalar to make
        if not (value.is_integer() and -_EXACT <= value <= _EXACT) and float(np.float32(value)) != value:
            exact = value  # (a python float: numpy 2 would compare in float32)
    if info or exact is not None:
        return Carry(info, exact)
    return {}


class Member(gym.Wrapper[Any, Any, Any, Any]):
    """One env of an :class:`aenvs.gymnasium.AsyncVectorEnv`: applies its autoreset mode as gymnasium does.

    The outermost wrapper, invisible to ``call`` / ``get_attr`` / ``set_attr``, which
    act on the env below it. Around a coroutine env (``async def`` step or reset) the
    adapter runs :meth:`coroutine_step` and, for reset, this class's own ``reset`` on the
    awaited result (see :func:`aenvs._adapters.gym_async.register_lift`).
    """

    def __init__(self, env: gym.Env[Any, Any], autoreset_mode: AutoresetMode) -> None:
        super().__init__(env)
        self._mode = autoreset_mode
        self._autoreset = False

    @property
    def spec(self) -> Any:  # the user's env spec, without this wrapper in its additional_wrappers
        return self.env.spec

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._autoreset = False
        return obs, _carry(info)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, Any]:
        if self._autoreset and self._resets_first():
            return self._reset_step(*self.env.reset())
        result = self.env.step(action)
        obs, reward, terminated, truncated, info = result
        if terminated or truncated:
            if self._mode is AutoresetMode.SAME_STEP:
                return self._step(result, self.env.reset())
        elif not info and type(reward) is float and reward.is_integer() and -_EXACT <= reward <= _EXACT:
            # the episode goes on, with nothing to carry (most steps): _step's result, sooner
            self._autoreset = False
            return obs, reward, terminated, truncated, {}
        return self._step(result, None)

    async def coroutine_step(
        self, action: Any, step: AsyncMethod, reset: AsyncMethod
    ) -> tuple[Any, Any, bool, bool, Any]:
        """:meth:`step` around a coroutine env: ``step`` and ``reset`` are the env's, lifted."""
        if self._resets_first():
            return self._reset_step(*await reset(seed=None, options=None))
        result = await step(action)
        if self._mode is AutoresetMode.SAME_STEP and (result[2] or result[3]):
            return self._step(result, await reset(seed=None, options=None))
        return self._step(result, None)

    def _resets_first(self) -> bool:
        """Whether this step is the reset of an ended episode (NEXT_STEP); DISABLED refuses it."""
        if not self._autoreset:
            return False
        if self._mode is AutoresetMode.DISABLED:
            raise AssertionError("autoreset_mode=DISABLED: reset this env (reset_mask) before stepping it")
        return self._mode is AutoresetMode.NEXT_STEP

    def _reset_step(self, obs: Any, info: dict[str, Any]) -> tuple[Any, Any, bool, bool, Any]:
        self._autoreset = False
        return obs, 0.0, False, False, _carry(info, 0.0)

    def _step(
        self, result: tuple[Any, Any, bool, bool, Any], reset: tuple[Any, Any] | None
    ) -> tuple[Any, Any, bool, bool, Any]:
        """A step's result; ``reset``: the reset that followed it (SAME_STEP), its info beside the final one."""
        obs, reward, terminated, truncated, info = result
        if reset is not None:
            final_obs, final_info = obs, info
            obs, info = reset
            info = {"final_info": final_info, "final_obs": final_obs, **info}
        self._autoreset = bool(terminated or truncated)
        return obs, reward, terminated, truncated, _carry(info, reward)

    def aenvs_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``VectorEnv.call`` for this env: call attribute ``name``, or return it if not callable."""
        attr = self.env.get_wrapper_attr(name)
        return attr(*args, **kwargs) if callable(attr) else attr

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        return self.env.set_wrapper_attr(name, value, force=force)


def _lift_member_step(member: Member) -> AsyncMethod:
    return functools.partial(
        member.coroutine_step, step=lifted(member.env, "step"), reset=lifted(member.env, "reset")
    )


register_lift("step", Member.step, _lift_member_step)
register_lift("reset", Member.reset)  # only lays out what the env's reset returned


def build_member(context: EnvContext, *, env_fn: EnvFn, autoreset_mode: AutoresetMode) -> Member:
    env = build_env(env_fn, context)
    if not isinstance(env, gym.Env):
        raise TypeError(
            f"env {context.env_index}: AsyncVectorEnv runs gymnasium envs, but the factory returned "
            f"{type(env).__name__}"
        )
    return Member(cast("gym.Env[Any, Any]", env), autoreset_mode)


def make_from_id(
    env_id: str, kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]]
) -> Any:
    env = gym.make(env_id, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env

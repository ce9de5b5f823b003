"""Coroutine gymnasium envs (``async def`` step or reset) and the synchronous wrappers around them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

import gymnasium as gym
from gymnasium.error import ResetNeeded
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

__all__ = ["is_coroutine_env", "lifted", "register_lift"]


AsyncMethod = Callable[..., Awaitable[Any]]
Lift = Callable[[Any], AsyncMethod]
"""How a synchronous wrapper method runs around a coroutine env: given the wrapper, the
coroutine function doing what its method does."""

_METHODS = ("step", "reset")
_LIFTS: dict[tuple[str, Callable[..., Any]], Lift] = {}
# synchronous wrapper methods that return what the env below returns untouched (a coroutine too)
_PASS_ON: set[Callable[..., Any]] = {
    gym.Wrapper.step,
    gym.Wrapper.reset,
    *(getattr(OrderEnforcing, name) for name in _METHODS),  # by name: its step's annotation is incomplete
    TimeLimit.reset,
    gym.ActionWrapper.step,
}


def _layers(env: Any) -> list[Any]:
    """``env`` and every env it wraps, outermost first."""
    layers = [env]
    while isinstance(env, gym.Wrapper):
        env = cast("gym.Wrapper[Any, Any, Any, Any]", env).env
        layers.append(env)
    return layers


def _function(method: Any) -> Any:
    return getattr(method, "__func__", method)


def is_coroutine_env(env: Any) -> bool:
    """Whether ``env`` or an env it wraps has an ``async def`` step or reset.

    Example:
        >>> is_coroutine_env(gym.make("CartPole-v1"))
        False
    """
    return any(
        inspect.iscoroutinefunction(getattr(layer, name, None)) for layer in _layers(env) for name in _METHODS
    )


def lifted(env: Any, name: str) -> AsyncMethod:
    """``env.step`` or ``env.reset`` (``name``) of a coroutine env as a coroutine function.

    A coroutine env is awaited; the synchronous gymnasium wrappers around it (they would
    hand its coroutine on unawaited, or fail unpacking it) cannot simply be called. aenvs
    runs the ones whose effect it knows around the awaited env, each as it would run
    around a plain env (the wrapper's own code, on the awaited result, where it only
    post-processes it): ``gymnasium.Wrapper``'s defaults, what ``gym.make`` adds
    (``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``), the ``ObservationWrapper``,
    ``RewardWrapper`` and ``ActionWrapper`` bases (``TransformObservation``,
    ``FlattenObservation``, ``ClipAction``, ``TransformReward``...), and those registered
    with :func:`register_lift`. Any other synchronous wrapper around a coroutine env is
    refused with a TypeError when the env is built, rather than guessed at: its step may
    do anything with the result, or call the env's reset. Wrappers of one's own can be
    ``async def`` instead (awaiting ``self.env.step``); such a wrapper's code calls the
    wrappers below it itself, so those must hand the coroutine on untouched.

    Example:
        >>> class Remote(gym.Env):
        ...     observation_space = action_space = gym.spaces.Discrete(2)
        ...     async def step(self, action):
        ...         return 0, 1.0, False, False, {}
        >>> step = lifted(gym.wrappers.TimeLimit(Remote(), max_episode_steps=1), "step")
        >>> inspect.iscoroutinefunction(step)
        True
    """
    method = getattr(env, name)
    if inspect.iscoroutinefunction(method):
        _check_awaited(env)
        return method
    layers = _layers(env)  # [env] if env is no wrapper, else [env, env.env, ...]
    if len(layers) == 1 or not is_coroutine_env(layers[1]):
        call = method

        async def plain(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs)

        return plain
    lift = _LIFTS.get((name, _function(method)))
    if lift is None:
        raise TypeError(
            f"{_function(method).__qualname__} is synchronous, but the env it wraps is a coroutine env "
            f"({_coroutine_layer(layers[1])}): aenvs cannot run {type(env).__name__} around it. "
            f"{_REMEDY}"
        )
    return lift(env)


_REMEDY = (
    "Make the wrapper's step and reset `async def` (awaiting self.env.step / self.env.reset), "
    "or leave it out; aenvs runs gymnasium's TimeLimit, OrderEnforcing, PassiveEnvChecker and "
    "the ObservationWrapper, RewardWrapper and ActionWrapper bases around coroutine envs itself."
)


def _coroutine_layer(env: Any) -> str:
    """Name the first ``async def`` method below a wrapper."""
    for layer in _layers(env):
        for name in _METHODS:
            if inspect.iscoroutinefunction(getattr(layer, name, None)):
                return f"{_function(getattr(layer, name)).__qualname__} is `async def`"
    return "no async def method"  # pragma: no cover - only called with a coroutine env


def _check_awaited(env: Any) -> None:
    """The synchronous wrappers under an ``async def`` method are called by its own code: each
    with a coroutine env below it must hand that env's coroutine on untouched."""
    for layer in _layers(env)[1:-1]:
        if not is_coroutine_env(layer.env):
            return
        for name in _METHODS:
            method = getattr(layer, name)
            if not inspect.iscoroutinefunction(method) and _function(method) not in _PASS_ON:
                raise TypeError(
                    f"{_function(method).__qualname__} is synchronous, but {type(env).__name__}, an "
                    f"`async def` wrapper, awaits what it returns, and the env below it is a coroutine env "
                    f"({_coroutine_layer(layer.env)}): it would get a coroutine. {_REMEDY}"
                )


def register_lift(name: str, method: Callable[..., Any], lift: Lift | None = None) -> None:
    """Declare how synchronous wrapper method ``method`` (its ``step`` or ``reset``: ``name``)
    runs around a coroutine env.

    With ``lift``: ``lift(wrapper)`` returns the coroutine function to run (it gets the
    env below's methods with ``lifted(wrapper.env, ...)``). Without: the env below is
    awaited with the same arguments, and ``method`` then runs on its result, which is
    right for a method that only post-processes what the env below returns.
    """
    _LIFTS[(name, method)] = lift or functools.partial(_after, name, method)


class _Answered:
    """The env below a wrapper, answering the call just awaited (``name``) with its result.

    Stands in for the wrapper's ``env`` while the wrapper's own method runs on the awaited
    result; everything else is the real env's.
    """

    def __init__(self, env: Any, name: str, result: Any) -> None:
        def answer(*args: Any, **kwargs: Any) -> Any:
            return result

        # the real method's signature (the passive checker inspects reset's)
        object.__setattr__(self, name, functools.update_wrapper(answer, getattr(env, name)))
        object.__setattr__(self, "_env", env)

    def __getattr__(self, name: str) -> Any:
        if name == "_env":  # not set (a copy in the making): no endless recursion
            raise AttributeError(name)
        return getattr(self._env, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._env, name, value)


def _after(name: str, method: Callable[..., Any], wrapper: Any) -> AsyncMethod:
    inner = lifted(wrapper.env, name)

    async def run(*args: Any, **kwargs: Any) -> Any:
        result = await inner(*args, **kwargs)
        env = wrapper.env
        wrapper.env = _Answered(env, name, result)  # no await until it is put back
        try:
            return method(wrapper, *args, **kwargs)
        finally:
            wrapper.env = env

    return run


def _pass_on(name: str, wrapper: Any) -> AsyncMethod:
    return lifted(wrapper.env, name)


def _order_enforced_step(wrapper: Any) -> AsyncMethod:
    step = lifted(wrapper.env, "step")

    async def run(action: Any) -> Any:
        if not wrapper.has_reset:
            raise ResetNeeded("Cannot call env.step() before calling env.reset()")
        return await step(action)

    return run


def _order_enforced_reset(wrapper: Any) -> AsyncMethod:
    reset = lifted(wrapper.env, "reset")

    async def run(*, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        wrapper._has_reset = True
        return await reset(seed=seed, options=options)

    return run


def _action_wrapped_step(wrapper: Any) -> AsyncMethod:
    step = lifted(wrapper.env, "step")

    async def run(action: Any) -> Any:
        return await step(wrapper.action(action))

    return run


for _name in _METHODS:
    register_lift(_name, getattr(gym.Wrapper, _name), functools.partial(_pass_on, _name))
    register_lift(_name, getattr(TimeLimit, _name))
    register_lift(_name, getattr(PassiveEnvChecker, _name))
    register_lift(_name, getattr(gym.ObservationWrapper, _name))
register_lift("step", gym.RewardWrapper.step)
register_lift("step", gym.ActionWrapper.step, _action_wrapped_step)
for _name, _lift in (("step", _order_enforced_step), ("reset", _order_enforced_reset)):
    register_lift(_name, getattr(OrderEnforcing, _name), _lift)

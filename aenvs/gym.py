"""Gymnasium envs as pool members: building them from ids or factories, and stepping them.

Everything here is numpy-only, so worker processes hosting gymnasium envs need no
torch. The parent turns the numpy data into tensors.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import types
import weakref
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from aenvs.env import Env, EnvContext
from aenvs.scalars import reward_value
from aenvs.specs import EnvSpec, Key, action_reader, flatten_value, observation_root

__all__ = [
    "EnvFn",
    "GymAdapter",
    "Outcome",
    "build_env",
    "is_coroutine_env",
    "lifted",
    "make_adapter",
    "register_lift",
]

EnvFn = Callable[..., Any] | str
"""An env factory: a gymnasium id, or a callable returning a gymnasium or aenvs env,
optionally taking an :class:`~aenvs.EnvContext`."""


class Outcome(NamedTuple):
    """One env's reset or step result, normalised: entries plus the step scalars."""

    items: list[tuple[Key, Any]]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] | None = None


# per factory: a pool of N envs usually repeats one factory N times, and inspect.signature
# costs more than building a small env (35 of the 44 ms a pool of 256 native envs took to start)
_TAKES_CONTEXT: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        return _TAKES_CONTEXT[fn]
    except (KeyError, TypeError):  # TypeError: not hashable, or not weakly referenceable
        pass
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins, some C callables
        return False
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    takes = len(required) == 1
    try:
        _TAKES_CONTEXT[fn] = takes
    except TypeError:
        pass
    return takes


def build_env(env_fn: EnvFn, context: EnvContext, make_kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build one env from a gymnasium id or a factory (given ``context`` if it takes one).

    Safe from several threads at once (see :func:`_build_once`).

    Example:
        >>> env = build_env("CartPole-v1", EnvContext(0, 0, 1))
        >>> env.spec.id
        'CartPole-v1'
    """
    if isinstance(env_fn, str):
        return _build_once(env_fn, _make, env_fn, make_kwargs)
    if not callable(env_fn):
        raise TypeError(
            f"env {context.env_index}: env_fns entries must be gymnasium ids or callables, "
            f"got {type(env_fn).__name__}"
        )
    env = _build_once(_factory_kind(env_fn), _call_factory, env_fn, context)
    if isinstance(env, str):
        return _build_once(env, _make, env, make_kwargs)
    return env


def _make(env_id: str, make_kwargs: Mapping[str, Any] | None) -> Any:
    return gym.make(env_id, **(make_kwargs or {}))


def _call_factory(env_fn: Callable[..., Any], context: EnvContext) -> Any:
    return env_fn(context) if _takes_context(env_fn) else env_fn()


# Building from several threads at once (the thread executor, threaded Ray actors, any
# caller of build_env): the first build of a kind of env is where its modules are imported,
# and CPython (3.11 at least) can hand a thread a partially initialized module when two
# threads import sibling submodules of a package whose __init__ imports them ("cannot import
# name 'PendulumEnv' from partially initialized module": the thread executor building five
# classic-control envs in a fresh interpreter failed so 7 times in 10). First builds take
# one process-wide lock, so they import one at a time; later builds of a kind already built
# import nothing new and run concurrently, so slow constructors (connections to remote
# simulators) still overlap, after the first. The wait for the lock is bounded: a factory
# that waits for envs built on other threads (a nested pool) would otherwise deadlock with
# them; past the bound a build goes ahead unguarded, as every build did before.
_BUILD_LOCK = threading.RLock()  # reentrant: a factory may build envs itself, on its thread
_BUILD_LOCK_WAIT = 10.0
_BUILT_KINDS: set[Hashable] = set()


def _new_build_lock() -> None:
    """In a forked child: a lock free of the parent's threads (one may have held it at the fork)."""
    global _BUILD_LOCK
    _BUILD_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_build_lock)


def _build_once(kind: Hashable, build: Callable[..., Any], *args: Any) -> Any:
    """``build(*args)``, under the build lock if no env of ``kind`` was built yet."""
    if kind not in _BUILT_KINDS and _BUILD_LOCK.acquire(timeout=_BUILD_LOCK_WAIT):
        try:
            if kind not in _BUILT_KINDS:  # else built on another thread while this one waited
                env = build(*args)
                _BUILT_KINDS.add(kind)  # not on failure: the next build tries under the lock again
                return env
        finally:
            _BUILD_LOCK.release()
    return build(*args)


# per factory, as _TAKES_CONTEXT: a pool of N envs usually repeats one factory N times
_KINDS: weakref.WeakKeyDictionary[Callable[..., Any], Hashable] = weakref.WeakKeyDictionary()


def _factory_kind(fn: Callable[..., Any]) -> Hashable:
    try:
        return _KINDS[fn]
    except (KeyError, TypeError):  # TypeError: not hashable, or not weakly referenceable
        pass
    kind = _kind(fn)
    try:
        _KINDS[fn] = kind
    except TypeError:
        pass
    return kind


def _kind(fn: Any, depth: int = 0) -> Hashable:
    """What a factory builds, as far as the modules it imports go.

    A gymnasium id is its own kind. A callable is its code (a function's code object, a
    class, a bound method's function and class), plus the names and factories it is bound
    to: the strings and callables among a ``functools.partial``'s arguments and a closure's
    variables, which select what gets imported (``partial(gym.make, "Pendulum-v1")``,
    CleanRL's ``make_env(env_id)`` thunks). Other bound values (numbers, configs, objects)
    parametrize a kind, so that ``[make(i) for i in range(64)]`` is one kind whose builds
    overlap. A factory choosing what to import from something else (an index into a list of
    ids) looks like one kind; its first builds are not guarded against each other.
    """
    if isinstance(fn, str):
        return fn
    if depth > 3:  # deep nests of factories: their type is as far as this looks
        return ("object", type(fn).__module__, type(fn).__qualname__)
    if isinstance(fn, functools.partial):
        keywords = tuple((k, _selector(v, depth)) for k, v in sorted(fn.keywords.items()))
        return ("partial", _kind(fn.func, depth + 1), tuple(_selector(a, depth) for a in fn.args), keywords)
    if isinstance(fn, type):
        return ("class", fn.__module__, fn.__qualname__)
    if isinstance(fn, types.MethodType):  # bound to an instance, or to a class (a classmethod)
        owner = fn.__self__ if isinstance(fn.__self__, type) else type(fn.__self__)
        return ("method", _kind(fn.__func__, depth + 1), owner.__module__, owner.__qualname__)
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        return (
            "function",
            code,
            tuple(_selector(_cell(c), depth) for c in getattr(fn, "__closure__", None) or ()),
        )
    return ("object", type(fn).__module__, type(fn).__qualname__)


def _selector(value: Any, depth: int) -> Hashable:
    """The part of a value a factory is bound to that can change what it imports."""
    if isinstance(value, str):
        return value
    if callable(value):
        return _kind(value, depth + 1)
    return None


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


# -- coroutine envs: async def step / reset, and the synchronous wrappers around them ---------

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
    OrderEnforcing.step,
    OrderEnforcing.reset,
    TimeLimit.reset,
    gym.ActionWrapper.step,
}


def _layers(env: Any) -> list[Any]:
    """``env`` and every env it wraps, outermost first."""
    layers = [env]
    while isinstance(env, gym.Wrapper):
        env = env.env
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
    if not isinstance(env, gym.Wrapper) or not is_coroutine_env(env.env):
        call = method

        async def plain(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs)

        return plain
    lift = _LIFTS.get((name, _function(method)))
    if lift is None:
        raise TypeError(
            f"{_function(method).__qualname__} is synchronous, but the env it wraps is a coroutine env "
            f"({_coroutine_layer(env.env)}): aenvs cannot run {type(env).__name__} around it. "
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
register_lift("step", OrderEnforcing.step, _order_enforced_step)
register_lift("reset", OrderEnforcing.reset, _order_enforced_reset)


class GymAdapter:
    """Runs a ``gymnasium.Env`` and lays its results out as :mod:`aenvs.specs` says.

    A coroutine env (a layer of which has an ``async def`` step or reset) is ``is_async``:
    its ``step`` and ``reset`` return awaitables, which the runner awaits and lays out with
    :meth:`outcome`; the wrappers around it run as :func:`lifted` says.
    """

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.spec = EnvSpec.from_spaces(env.observation_space, env.action_space)
        self._obs_space = env.observation_space
        self._obs_root = observation_root(self._obs_space)
        self._flat_obs = isinstance(self._obs_space, gym.spaces.Box | gym.spaces.Discrete)
        self._action_space = env.action_space
        self._actions: Mapping[Key, np.ndarray] | None = None
        self._read_action: Callable[[int], Any] = lambda row: None
        self.is_async = is_coroutine_env(env)
        # built once: raises here (the env's "make") if a wrapper cannot run around a coroutine env
        self._async_step = lifted(env, "step") if self.is_async else None
        self._async_reset = lifted(env, "reset") if self.is_async else None

    def _items(self, obs: Any) -> list[tuple[Key, Any]]:
        if self._flat_obs:
            return [(self._obs_root, obs)]
        return list(flatten_value(self._obs_space, obs, self._obs_root))

    def outcome(self, out: Any, step: bool) -> Outcome:
        """Lay out what a coroutine env's step (``step=True``) or reset returned, once awaited."""
        if step:
            obs, reward, terminated, truncated, info = out
            return Outcome(self._items(obs), reward_value(reward), bool(terminated), bool(truncated), info)
        obs, info = out
        return Outcome(self._items(obs), info=info)

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Any:
        """An Outcome, or for a coroutine env an awaitable of ``(obs, info)``."""
        options = dict(options) if options else None
        if self._async_reset is not None:
            return self._async_reset(seed=seed, options=options)
        out = self.env.reset(seed=seed, options=options)
        try:
            obs, info = out
        except TypeError:
            raise _not_a_result(self.env, "reset", out) from None
        return Outcome(self._items(obs), info=info)

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Any:
        """An Outcome, or for a coroutine env an awaitable of the 5-tuple of ``env.step``."""
        if self._actions is not actions:  # first step: compile the reader for these buffers
            self._read_action = action_reader(self._action_space, actions)
            self._actions = actions
        if self._async_step is not None:
            return self._async_step(self._read_action(row))
        out = self.env.step(self._read_action(row))
        try:
            obs, reward, terminated, truncated, info = out
        except TypeError:
            raise _not_a_result(self.env, "step", out) from None
        return Outcome(self._items(obs), reward_value(reward), bool(terminated), bool(truncated), info)

    def seed(self, seed: int | None) -> Any:
        if self._async_reset is not None:
            return self._seed_async(seed)
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)

    async def _seed_async(self, seed: int | None) -> None:
        assert self._async_reset is not None
        await self._async_reset(seed=seed, options=None)
        self.env.action_space.seed(seed)

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)

    def close(self) -> Any:
        return self.env.close()


def _not_a_result(env: gym.Env, name: str, out: Any) -> Exception:
    """The error for a step or reset result that cannot be unpacked: a clear one if it is a
    coroutine that a method not declared ``async def`` returned."""
    if not inspect.isawaitable(out):
        return TypeError(f"{type(env.unwrapped).__name__}.{name} returned {type(out).__name__}, not a tuple")
    if inspect.iscoroutine(out):
        out.close()  # never awaited: no "never awaited" warning on top of this error
    return TypeError(
        f"{type(env.unwrapped).__name__}.{name} returned a coroutine, but is not a coroutine function: "
        "declare it `async def` so that aenvs awaits it (and runs the env concurrently with others)"
    )


def make_adapter(env: Any) -> Any:
    """Wrap a built env in the adapter that runs it (gymnasium, native aenvs or TorchRL)."""
    if isinstance(env, Env):
        from aenvs.native import NativeAdapter  # torch is needed only for native envs

        return NativeAdapter(env)
    if isinstance(env, gym.Env):
        return GymAdapter(env)
    if hasattr(env, "full_observation_spec") and hasattr(env, "full_action_spec"):  # a TorchRL env
        from aenvs.torchrl import TorchRLAdapter

        return TorchRLAdapter(env)
    raise TypeError(
        f"an env factory returned {type(env).__name__}; expected a gymnasium.Env, "
        "an aenvs.Env, a TorchRL env or a gymnasium id string"
    )

"""Building envs from ids or factories, safely from several threads, and choosing their adapter."""

from __future__ import annotations

import functools
import inspect
import os
import threading
import types
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, cast

import gymnasium as gym

from aenvs._env import Env, EnvContext, EnvFn

__all__ = ["build_env", "make_adapter"]


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
_build_lock = threading.RLock()  # reentrant: a factory may build envs itself, on its thread
_BUILD_LOCK_WAIT = 10.0
_BUILT_KINDS: set[Hashable] = set()


def _new_build_lock() -> None:
    """In a forked child: a lock free of the parent's threads (one may have held it at the fork)."""
    global _build_lock
    _build_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_build_lock)


def _build_once(kind: Hashable, build: Callable[..., Any], *args: Any) -> Any:
    """``build(*args)``, under the build lock if no env of ``kind`` was built yet."""
    if kind not in _BUILT_KINDS and _build_lock.acquire(timeout=_BUILD_LOCK_WAIT):
        try:
            if kind not in _BUILT_KINDS:  # else built on another thread while this one waited
                env = build(*args)
                _BUILT_KINDS.add(kind)  # not on failure: the next build tries under the lock again
                return env
        finally:
            _build_lock.release()
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


def make_adapter(env: Any) -> Any:
    """Wrap a built env in the adapter that runs it (gymnasium, native aenvs, multi-agent or TorchRL)."""
    if isinstance(env, Env):
        from aenvs._adapters.native import NativeAdapter  # torch is needed only for native envs

        return NativeAdapter(env)
    # before gymnasium: RLlib's MultiAgentEnv is a gymnasium.Env
    from aenvs._adapters.multi_agent import multi_agent_adapter

    multi_agent = multi_agent_adapter(env)
    if multi_agent is not None:
        return multi_agent
    if isinstance(env, gym.Env):
        from aenvs._adapters.gym import GymAdapter

        return GymAdapter(cast("gym.Env[Any, Any]", env))
    if hasattr(env, "full_observation_spec") and hasattr(env, "full_action_spec"):  # a TorchRL env
        from aenvs._adapters.torchrl import TorchRLAdapter
        from aenvs._adapters.torchrl_gym import GymEnvAdapter, plain_gym_env

        inner = plain_gym_env(env)
        if inner is not None:  # a GymEnv that adds nothing: stepped through its gymnasium env
            return GymEnvAdapter(env, inner)

        return TorchRLAdapter(env)
    raise TypeError(
        f"an env factory returned {type(env).__name__}; expected a gymnasium.Env, an aenvs.Env, "
        "a multi-agent env (PettingZoo parallel or RLlib-style dict env), a TorchRL env or a gymnasium id string"
    )

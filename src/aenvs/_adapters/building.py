"""Building envs from ids or factories, and using them first, safely from several threads; and
choosing their adapter."""

from __future__ import annotations

import functools
import inspect
import os
import re
import threading
import types
import typing
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar, cast

import gymnasium as gym

from aenvs._env import Env, EnvContext, EnvFn

__all__ = ["FIRST_USES", "build_env", "env_kind", "first_use", "make_adapter", "warm"]

T = TypeVar("T")


# per factory: a pool of N envs usually repeats one factory N times, and inspect.signature
# costs more than building a small env (35 of the 44 ms a pool of 256 native envs took to start)
_CALLERS: weakref.WeakKeyDictionary[Callable[..., Any], Callable[[Any, EnvContext], Any]] = (
    weakref.WeakKeyDictionary()
)
_CONTEXT_NAMES = ("ctx", "context")
_ANNOTATION = re.compile(r"\bEnvContext\b")  # in an annotation left a string (PEP 563)


def _without_context(fn: Callable[..., Any], context: EnvContext) -> Any:
    return fn()


def _positional_context(fn: Callable[..., Any], context: EnvContext) -> Any:
    return fn(context)


def _keyword_context(name: str, fn: Callable[..., Any], context: EnvContext) -> Any:
    return fn(**{name: context})


def _caller(fn: Callable[..., Any]) -> Callable[[Any, EnvContext], Any]:
    """How to call the factory ``fn``: with its env's EnvContext or without (see
    :func:`build_env`)."""
    try:
        return _CALLERS[fn]
    except (KeyError, TypeError):  # TypeError: not hashable, or not weakly referenceable
        pass
    caller = _context_caller(fn)
    try:
        _CALLERS[fn] = caller
    except TypeError:
        pass
    return caller


def _context_caller(fn: Callable[..., Any]) -> Callable[[Any, EnvContext], Any]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins, some C callables
        return _without_context
    wants = next((p for p in params if _is_context_annotation(p.annotation)), None)
    if wants is None:
        wants = next((p for p in params if p.name in _CONTEXT_NAMES and p.kind is not p.VAR_KEYWORD), None)
    if wants is not None and wants.kind is not wants.VAR_POSITIONAL:
        if wants.kind is not wants.POSITIONAL_ONLY:
            return functools.partial(_keyword_context, wants.name)
        if wants is params[0]:
            return _positional_context
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return _positional_context if len(required) == 1 else _without_context


def _is_context_annotation(annotation: Any) -> bool:
    """``EnvContext``, ``EnvContext | None``, ``Optional[EnvContext]``, or a string naming it."""
    if annotation is EnvContext:
        return True
    if isinstance(annotation, str):
        return _ANNOTATION.search(annotation) is not None
    return any(_is_context_annotation(a) for a in typing.get_args(annotation))


def build_env(env_fn: EnvFn, context: EnvContext, make_kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build one env from a gymnasium id or a factory, given ``context`` if it asks for one.

    A factory asks for its EnvContext with a parameter annotated ``EnvContext`` (or
    ``EnvContext | None``), else one named ``ctx`` or ``context`` (with a default or not;
    both passed by keyword, or first by position if positional-only), else with exactly one
    positional parameter that has no default (``lambda c: ...``). Any other factory is called
    with no argument: ``def make(seed=0)``, ``functools.partial(gymnasium.make, env_id)``.

    Safe from several threads at once (see :func:`_run_once_guarded`).

    Example:
        >>> env = build_env("CartPole-v1", EnvContext(0, 0, 1))
        >>> env.spec.id
        'CartPole-v1'
    """
    if isinstance(env_fn, str):
        return _run_once_guarded(env_fn, _make, env_fn, make_kwargs)
    if not callable(env_fn):
        raise TypeError(
            f"env {context.env_index}: env_fns entries must be gymnasium ids or callables, "
            f"got {type(env_fn).__name__}"
        )
    env = _run_once_guarded(_factory_kind(env_fn), _call_factory, env_fn, context)
    if isinstance(env, str):
        return _run_once_guarded(env, _make, env, make_kwargs)
    return env


def _make(env_id: str, make_kwargs: Mapping[str, Any] | None) -> Any:
    return gym.make(env_id, **(make_kwargs or {}))


def _call_factory(env_fn: Callable[..., Any], context: EnvContext) -> Any:
    return _caller(env_fn)(env_fn, context)


# Envs first used from several threads at once (the thread executor, Ray's actors stepping
# plain envs on threads, any caller of build_env): the first build of a kind of env is where
# its modules are imported, and CPython (3.11 at least) can hand a thread a partially
# initialized module when two threads import sibling submodules of a package whose __init__
# imports them ("cannot import name 'PendulumEnv' from partially initialized module": the
# thread executor building five classic-control envs in a fresh interpreter failed so 7
# times in 10). Imports also happen later, at an env's first reset or step: a library may
# load a module on first use, and a thread reading it meanwhile can find it without its
# attributes: a module loaded lazily (importlib's LazyLoader, until CPython 3.12.3: pygame's
# surfarray, "module 'pygame.surfarray' has no attribute 'pixels3d'", PettingZoo's pistonball
# reset on the thread executor failing 6 times in 40), or an attribute that a module sets on
# its package as its import ends. So the first build, the first reset and the first step of
# a kind each take one process-wide lock, and run one at a time; later ones, with nothing
# left to import, run concurrently, so that slow constructors and resets (connections to
# remote simulators) still overlap, after the first. The wait for the lock is bounded: an
# env that waits for envs run on other threads (a nested pool, envs meeting at their first
# reset) would otherwise deadlock with them; past the bound it goes ahead unguarded.
_build_lock = threading.RLock()  # reentrant: a factory may build envs itself, on its thread
_BUILD_LOCK_WAIT = 10.0
_RAN: set[Hashable] = set()  # what ran once under the lock: kinds built, (kind, stage) pairs
FIRST_USES = ("reset", "step")  # the commands that may still import: run once under the lock


def _new_build_lock() -> None:
    """In a forked child: a lock free of the parent's threads (one may have held it at the fork)."""
    global _build_lock
    _build_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_build_lock)


def _run_once_guarded(key: Hashable, run: Callable[..., T], *args: Any) -> T:
    """``run(*args)``, under the build lock if nothing ran as ``key`` yet."""
    if key not in _RAN and _build_lock.acquire(timeout=_BUILD_LOCK_WAIT):
        try:
            if key not in _RAN:  # else it ran on another thread while this one waited
                out = run(*args)
                _RAN.add(key)  # not on failure: the next one runs under the lock again
                return out
        finally:
            _build_lock.release()
    return run(*args)


def first_use(kind: Hashable, stage: str, run: Callable[..., T], *args: Any) -> T:
    """``run(*args)``, an env's ``stage`` (one of :data:`FIRST_USES`), under the build lock
    until one env of ``kind`` (:func:`env_kind`) ran it.

    Example:
        >>> first_use("an example kind", "reset", lambda: "reset done")
        'reset done'
        >>> warm("an example kind")  # its first step is still to come
        False
    """
    return _run_once_guarded((kind, stage), run, *args)


def warm(kind: Hashable) -> bool:
    """Whether an env of ``kind`` has reset and stepped once: its library is all imported, and
    the others of its kind run their commands unguarded."""
    return all((kind, stage) in _RAN for stage in FIRST_USES)


def env_kind(env_fn: EnvFn) -> Hashable:
    """The kind of env ``env_fn`` builds (:func:`_kind`), for :func:`first_use`.

    Example:
        >>> env_kind("CartPole-v1")
        'CartPole-v1'
    """
    if isinstance(env_fn, str) or not callable(env_fn):
        return env_fn
    return _factory_kind(env_fn)


# per factory, as _CALLERS: a pool of N envs usually repeats one factory N times
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

"""Executors: where a pool's envs run. Pick one by name or pass an instance.

==========  ==========================================================
``inline``  on the event loop (coroutine envs concurrently)
``thread``  on worker threads (one env per thread by default)
``process`` in worker processes, results in shared memory
``ray``     in Ray actors, on this machine or a cluster (``aenvs[ray]``)
==========  ==========================================================

Writing an executor of your own: subclass :class:`Executor`, declare its
:class:`Capabilities`, host the envs in :class:`EnvRunner` s (one per worker), give the
pool its result rows (:class:`Buffers`), turn each :class:`Command` into one
:class:`Completion` per env, and prove it with :func:`aenvs.testing.check_executor`.
"""

from __future__ import annotations

from collections.abc import Callable

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._runner import EnvRunner
from aenvs.executors._base import Capabilities, Executor
from aenvs.executors._inline import InlineExecutor
from aenvs.executors._process import ProcessExecutor
from aenvs.executors._ray import RayExecutor
from aenvs.executors._thread import ThreadExecutor

__all__ = [
    "Buffers",
    "Capabilities",
    "Command",
    "CommandKind",
    "Completion",
    "EnvRunner",
    "Executor",
    "InlineExecutor",
    "ProcessExecutor",
    "RayExecutor",
    "RemoteError",
    "ThreadExecutor",
    "make_executor",
    "register_executor",
]

_FACTORIES: dict[str, Callable[..., Executor]] = {
    "inline": InlineExecutor,
    "thread": ThreadExecutor,
    "process": ProcessExecutor,
    "ray": RayExecutor,  # imports ray when built, with an error naming the extra if it is missing
}


def register_executor(name: str, factory: Callable[..., Executor]) -> None:
    """Make ``executor=name`` build executors with ``factory(**options)``."""
    _FACTORIES[name] = factory


def make_executor(executor: str | Executor, **options: object) -> Executor:
    """Resolve an executor name (with options such as ``envs_per_worker``) or pass an instance through.

    Example:
        >>> from aenvs.executors import make_executor
        >>> make_executor("thread", envs_per_worker=2).envs_per_worker
        2
    """
    if isinstance(executor, Executor):
        return executor
    factory = _FACTORIES.get(executor)
    if factory is None:
        raise ValueError(
            f"unknown executor {executor!r}; choose one of {sorted(_FACTORIES)} or pass an Executor"
        )
    return factory(**{k: v for k, v in options.items() if v is not None})

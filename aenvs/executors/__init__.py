"""Executors: where a pool's envs run. Pick one by name or pass an instance.

==========  ==========================================================
``inline``  on the event loop (coroutine envs concurrently)
``thread``  on worker threads (one env per thread by default)
``process`` in worker processes, results in shared memory
``ray``     in Ray actors, on this machine or a cluster (``aenvs[ray]``)
==========  ==========================================================
"""

from __future__ import annotations

from collections.abc import Callable

from aenvs.executors.base import Executor
from aenvs.executors.inline import InlineExecutor
from aenvs.executors.process import ProcessExecutor
from aenvs.executors.ray import RayExecutor
from aenvs.executors.thread import ThreadExecutor

__all__ = [
    "Executor",
    "InlineExecutor",
    "ProcessExecutor",
    "RayExecutor",
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

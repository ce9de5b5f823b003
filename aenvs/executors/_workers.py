"""What the process and Ray executors share: envs hosted in groups by workers that die whole.

Each worker hosts a contiguous group of envs (``split_envs``) and lives and dies as a
unit. This base keeps which worker hosts which env, answers every command in flight on
a worker that died with a crash, splits a command per worker, and replaces dead workers
when the pool restarts their envs, checking that the rebuilt envs keep their layout.
How a worker is started, watched and stopped is the subclass's.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import cloudpickle

from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn
from aenvs._specs import EnvSpec
from aenvs.executors._base import Executor

__all__ = ["Worker", "WorkerGroupExecutor"]


class Worker(Protocol):
    """What the base needs of a worker: its envs, whether it lives, and what runs on it."""

    index: int
    env_indices: list[int]
    alive: bool
    in_flight: dict[int, CommandKind]


W = TypeVar("W", bound=Worker)


class WorkerGroupExecutor(Executor, Generic[W]):
    """An executor whose envs live in workers, several per worker.

    Subclasses start workers (``_start_workers``), describe and stop them (``_describe``,
    ``_stop``), make a dead worker's successor (``_successor``) and may act once
    successors have built their envs (``_restarted``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._workers: list[W] = []
        self._worker_of: list[W] = []  # by env index
        self._specs: list[EnvSpec] = []
        self._recipe: tuple[Sequence[EnvFn], Sequence[int | None], Mapping[int, Any]] = ((), (), {})
        self._pickled: dict[int, bytes] = {}  # by worker index: recipes pickled for a first start
        self._closing = False

    # -- hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    async def _start_workers(self, workers: list[W]) -> dict[int, EnvSpec]:
        """Start ``workers`` and wait until each has built its envs; their specs by env index."""

    @abc.abstractmethod
    def _describe(self, worker: W, why: str) -> str:
        """``worker``, named for an error message, followed by ``why`` ("died", ...)."""

    @abc.abstractmethod
    def _stop(self, worker: W, why: str) -> None:
        """Kill ``worker`` now and answer its commands in flight with a crash."""

    @abc.abstractmethod
    def _successor(self, dead: W) -> W:
        """A new, unstarted worker for the envs of ``dead`` (releasing what ``dead`` held)."""

    def _restarted(self, workers: list[W]) -> None:
        """Successors built their envs; the pool is about to reset them."""

    # -- shared -------------------------------------------------------------------------

    def _place(self, workers: list[W]) -> None:
        """Host the envs on ``workers`` (not started yet), after pickling each worker's recipe:
        an env that cannot be pickled fails here, before any worker starts."""
        self._pickled = {w.index: self._pickle_recipe(w.env_indices) for w in workers}
        self._workers = workers
        self._worker_of = [w for w in workers for _ in w.env_indices]

    def _recipe_of(self, worker: W) -> bytes:
        """The factories, seeds and make kwargs of ``worker``'s envs, pickled for it."""
        pickled = self._pickled.pop(worker.index, None)  # pickled by _place (a first start)
        return pickled if pickled is not None else self._pickle_recipe(worker.env_indices)

    def _pickle_recipe(self, ids: Sequence[int]) -> bytes:
        """The recipe of envs ``ids``, pickled in one piece (a factory shared by the envs is
        pickled once); a ``TypeError`` naming the first env that cannot be pickled, and what."""
        env_fns, seeds, make_kwargs = self._recipe
        recipe = (
            {i: env_fns[i] for i in ids},
            {i: seeds[i] for i in ids},
            {i: make_kwargs.get(i) for i in ids},
        )
        try:
            return cloudpickle.dumps(recipe)
        except Exception as exc:
            for i in ids:
                parts = [(f"factory {_short_repr(env_fns[i])}", env_fns[i])]
                parts += [
                    (f"make_kwargs entry {k!r} ({_short_repr(v)})", v)
                    for k, v in (make_kwargs.get(i) or {}).items()
                ]
                for what, value in parts:
                    try:
                        cloudpickle.dumps(value)
                    except Exception as reason:
                        raise self._unpicklable(i, what, reason) from reason
            raise self._unpicklable(ids[0], f"recipe of envs {list(ids)}", exc) from exc

    def _unpicklable(self, env_index: int, what: str, reason: Exception) -> TypeError:
        return TypeError(
            f"env {env_index} cannot be sent to a worker of the {self.name} executor: its {what} "
            f"cannot be pickled ({type(reason).__name__}: {reason}). The {self.name} executor "
            f"pickles env factories (with cloudpickle): create what cannot be pickled (locks, "
            f"sockets, open files, clients) inside the factory rather than capturing it"
        )

    def _workers_of(self, env_indices: Sequence[int]) -> list[W]:
        return list({id(w): w for w in (self._worker_of[i] for i in env_indices)}.values())

    def _split(self, command: Command) -> list[tuple[W, Command]]:
        """``command`` per live worker hosting some of its envs (the command itself when one
        worker hosts them all); envs on a dead worker are answered with a crash at the loop's
        next turn (never inside ``submit``: the pool records the send first)."""
        by_worker: dict[int, list[int]] = {}
        worker_of = self._worker_of
        for i in command.env_indices:
            by_worker.setdefault(worker_of[i].index, []).append(i)
        whole = len(by_worker) == 1
        parts: list[tuple[W, Command]] = []
        for index, env_indices in by_worker.items():
            worker = self._workers[index]
            if worker.alive:
                parts.append((worker, command if whole else command.subset(env_indices)))
                continue
            error = RemoteError.worker_died(self._describe(worker, "died"))
            assert self._loop is not None
            self._loop.call_soon(self._push, [Completion(i, command.kind, error=error) for i in env_indices])
        return parts

    def _crash_in_flight(self, worker: W, why: str) -> None:
        """Answer every command in flight on ``worker`` (which died: ``why``) with a crash."""
        if self._closing:
            return
        error = RemoteError.worker_died(self._describe(worker, why))
        lost = [Completion(i, kind, error=error) for i, kind in worker.in_flight.items()]
        worker.in_flight.clear()
        if lost:
            self._push(lost)

    # -- restarts -----------------------------------------------------------------------

    def worker_alive(self, env_index: int) -> bool:
        return self._worker_of[env_index].alive

    def abort(self, env_indices: Sequence[int]) -> None:
        for worker in self._workers_of(env_indices):
            if worker.alive:
                self._stop(worker, "was killed: a command it ran outlived its timeout")

    async def respawn(self, env_indices: Sequence[int]) -> list[int]:
        fresh: list[W] = []
        for dead in (w for w in self._workers_of(env_indices) if not w.alive):
            worker = self._successor(dead)
            self._workers[self._workers.index(dead)] = worker
            for i in worker.env_indices:
                self._worker_of[i] = worker
            fresh.append(worker)
        if not fresh:
            return []
        try:
            specs_by_env = await self._start_workers(fresh)
        except BaseException:
            for worker in fresh:
                self._stop(worker, "failed to start again")
            raise
        for i, spec in specs_by_env.items():
            difference = self._specs[i].layout_difference(spec)
            if difference is not None:
                for worker in fresh:
                    self._stop(worker, "was rebuilt with a different layout")
                raise ValueError(f"env {i} was rebuilt with a different layout: {difference}")
        self._restarted(fresh)
        return [i for w in fresh for i in w.env_indices]


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

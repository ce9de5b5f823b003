"""What the thread, process and Ray executors share: envs hosted in groups by workers.

Each worker hosts a contiguous group of envs (``split_envs``) and lives and dies as a
unit. This base starts the pool's workers, keeps which worker hosts which env, tracks
the commands in flight on each worker, answers those of a worker that died with a
crash, splits a command per worker, and replaces dead workers when the pool restarts
their envs, checking that the rebuilt envs keep their layout. How a worker is started,
watched and stopped is the subclass's.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn
from aenvs._specs import EnvSpec
from aenvs.executors._base import Executor, check_worker_options, split_envs
from aenvs.executors._pickling import cloudpickle_dumps

__all__ = ["Worker", "WorkerGroupExecutor"]


class Worker(Protocol):
    """What the base needs of a worker: its envs, whether it lives, and what runs on it."""

    index: int
    env_indices: list[int]
    alive: bool
    in_flight: dict[int, CommandKind]  # env -> the command sent to it and not answered yet


W = TypeVar("W", bound=Worker)


class WorkerGroupExecutor(Executor, Generic[W]):
    """An executor whose envs live in workers, one or several per worker.

    Subclasses make a worker (``_new_worker``), start workers (``_start_workers``), describe
    and stop them (``_describe``, ``_stop``), and hand built workers the pool's buffers
    (``_serve``); they may connect first (``_prepare``), pick their default worker count
    (``_default_workers``), allocate the buffers (``_allocate``), release a dead worker's
    leftovers (``_successor``) and clean up a start that failed (``_give_up``).

    Example:
        >>> from aenvs.executors import ProcessExecutor, RayExecutor, ThreadExecutor
        >>> all(issubclass(e, WorkerGroupExecutor) for e in (ThreadExecutor, ProcessExecutor, RayExecutor))
        True
    """

    #: how a dead worker is described when a command is sent to it (see ``_describe``)
    _death: ClassVar[str] = "died"
    #: why :meth:`abort` stopped a worker, as its commands in flight are answered
    _abort_reason: ClassVar[str] = "was killed: a command it ran outlived its timeout"

    def __init__(
        self,
        num_workers: int | None,
        envs_per_worker: int | None,
        startup_timeout: float | None,
        close_timeout: float,
    ) -> None:
        super().__init__()
        check_worker_options(num_workers, envs_per_worker)
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.startup_timeout = startup_timeout
        self.close_timeout = close_timeout
        self._workers: list[W] = []
        self._worker_of: list[W] = []  # by env index
        self._every_env: list[int] = []  # the envs of every worker, in order
        self._specs: list[EnvSpec] = []
        self._recipe: tuple[Sequence[EnvFn], Sequence[int | None], Mapping[int, Mapping[str, Any]]] = (
            (),
            (),
            {},
        )
        self._pickled: dict[int, bytes] = {}  # by worker index: recipes pickled for a first start
        self._closing = False

    # -- hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    def _new_worker(self, index: int, env_indices: list[int]) -> W:
        """A new, unstarted worker ``index`` for envs ``env_indices``."""

    @abc.abstractmethod
    async def _start_workers(self, workers: list[W]) -> dict[int, EnvSpec]:
        """Start ``workers`` and wait until each has built its envs; their specs by env index."""

    @abc.abstractmethod
    def _describe(self, worker: W, why: str) -> str:
        """``worker``, named for an error message, followed by ``why`` ("died", ...)."""

    @abc.abstractmethod
    def _stop(self, worker: W, why: str) -> None:
        """Kill ``worker`` now and answer its commands in flight with a crash."""

    async def _prepare(self) -> None:
        """Get ready to start workers (connect to a cluster, ...), at the start of :meth:`start`."""

    def _default_workers(self, num_envs: int) -> int:
        """How many workers when neither ``num_workers`` nor ``envs_per_worker`` is given."""
        return num_envs

    def _allocate(self, specs: list[EnvSpec]) -> Buffers:
        """The pool's buffers for envs of ``specs``, once every worker has built its envs."""
        return Buffers.allocate(specs)

    def _serve(self, workers: list[W]) -> None:
        """``workers`` built their envs and ``self.buffers`` is there: they may start serving."""

    def _successor(self, dead: W) -> W:
        """A new, unstarted worker for the envs of ``dead`` (releasing what ``dead`` held)."""
        return self._new_worker(dead.index, dead.env_indices)

    async def _give_up(self) -> None:
        """Stop everything after :meth:`start` failed."""
        self.kill()

    # -- start --------------------------------------------------------------------------

    async def start(
        self,
        env_fns: Sequence[EnvFn],
        *,
        seeds: Sequence[int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[EnvSpec]:
        self._bind_loop()
        num_envs = len(env_fns)
        self._recipe = (env_fns, seeds, make_kwargs or {})
        try:
            await self._prepare()
            default = self._default_workers(num_envs)
            groups = split_envs(num_envs, self.envs_per_worker, self.num_workers, default)
            self._place([self._new_worker(k, ids) for k, ids in enumerate(groups)])
            specs_by_env = await self._start_workers(self._workers)
            self._specs = specs = [specs_by_env[i] for i in range(num_envs)]
            self.buffers = self._allocate(specs)
            self._serve(self._workers)
            return specs
        except BaseException:
            await self._give_up()
            raise

    def _place(self, workers: list[W]) -> None:
        """Host the envs on ``workers`` (not started yet). An executor that pickles factories
        pickles each worker's recipe first: an env that cannot be pickled fails here, before
        any worker starts."""
        if self.capabilities.pickles_factories:
            self._pickled = {w.index: self._pickle_recipe(w.env_indices) for w in workers}
        self._workers = workers
        self._worker_of = [w for w in workers for _ in w.env_indices]
        self._every_env = [i for w in workers for i in w.env_indices]

    # -- recipes ------------------------------------------------------------------------

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
            return cloudpickle_dumps(recipe)
        except Exception as exc:
            for i in ids:
                parts: list[tuple[str, object]] = [(f"factory {_short_repr(env_fns[i])}", env_fns[i])]
                parts += [
                    (f"make_kwargs entry {k!r} ({_short_repr(v)})", v)
                    for k, v in (make_kwargs.get(i) or {}).items()
                ]
                for what, value in parts:
                    try:
                        cloudpickle_dumps(value)
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

    # -- commands -----------------------------------------------------------------------

    def _workers_of(self, env_indices: Sequence[int]) -> list[W]:
        return list({id(w): w for w in (self._worker_of[i] for i in env_indices)}.values())

    def _split(self, command: Command) -> list[tuple[W, Command]]:
        """``command`` per live worker hosting some of its envs (the command itself when one
        worker hosts them all); envs on a dead worker are answered with a crash at the loop's
        next turn (:meth:`_answer_dead`)."""
        worker_of, indices = self._worker_of, command.env_indices
        by_worker: dict[int, list[int]]
        if len(indices) == len(worker_of) and indices == self._every_env:  # each worker's own envs
            by_worker = {w.index: list(w.env_indices) for w in self._workers}
        else:
            by_worker = {}
            for i in indices:
                by_worker.setdefault(worker_of[i].index, []).append(i)
        whole = len(by_worker) == 1
        parts: list[tuple[W, Command]] = []
        for index, env_indices in by_worker.items():
            worker = self._workers[index]
            if worker.alive:
                parts.append((worker, command if whole else command.subset(env_indices)))
            else:
                self._answer_dead(worker, command.kind, env_indices)
        return parts

    def _answer_dead(self, worker: W, kind: CommandKind, env_indices: list[int]) -> None:
        """Answer a command for envs of the dead ``worker`` with a crash, at the loop's next
        turn (never inside ``submit``: the pool records the send first)."""
        error = RemoteError.worker_died(self._describe(worker, self._death))
        assert self._loop is not None
        self._loop.call_soon(self._push, [Completion(i, kind, error=error) for i in env_indices])

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
                self._stop(worker, self._abort_reason)

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
        self._serve(fresh)
        return [i for w in fresh for i in w.env_indices]


def _short_repr(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""The executor interface: moving commands out to envs and completions back.

An executor is mechanism only. It builds the envs (inside its workers, through
:class:`~aenvs._runner.EnvRunner`), hands each command to the workers hosting its
envs, and queues the completions that come back. Batching, env states, routing,
stacking and the error policy are the pool's.

Completions are consumed in two steps so that a cancelled receive loses nothing:
``wait_ready()`` returns once ``poll()`` would be non-empty and consumes nothing;
``poll()`` never blocks.
"""

from __future__ import annotations

import abc
import asyncio
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, Packed, unpack
from aenvs._env import EnvFn
from aenvs._errors import EnvTimeoutError
from aenvs._specs import EnvSpec

__all__ = ["Capabilities", "Executor", "check_worker_options", "split_envs"]


def split_envs(
    num_envs: int, envs_per_worker: int | None, num_workers: int | None, default_workers: int
) -> list[list[int]]:
    """Contiguous groups of env indices, one per worker: ``envs_per_worker`` envs each if
    given, else the envs spread evenly over ``num_workers`` (default ``default_workers``).

    Example:
        >>> split_envs(5, None, 2, 8)
        [[0, 1, 2], [3, 4]]
    """
    if envs_per_worker is not None:
        per = envs_per_worker
    else:
        per = math.ceil(num_envs / min(num_workers or default_workers, num_envs))
    return [list(range(i, min(i + per, num_envs))) for i in range(0, num_envs, per)]


def check_worker_options(num_workers: int | None, envs_per_worker: int | None) -> None:
    """Raise ValueError for a worker count or an envs-per-worker count under 1."""
    for name, value in (("num_workers", num_workers), ("envs_per_worker", envs_per_worker)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class Capabilities:
    """What an executor can do, declared once; the pool and the conformance kit read it.

    Attributes:
        abort: stop a command in flight (:meth:`Executor.abort`: ``step_timeout`` /
            ``reset_timeout`` need it).
        respawn: replace a dead or stopped worker (:meth:`Executor.respawn`: restarting an
            env whose worker died needs it; in-place rebuilds do not).
        blocks_loop: plain envs' code runs on the event loop's thread.
        pickles_factories: env factories (and make kwargs) must pickle: they travel to
            another process.

    Example:
        >>> from aenvs.executors import Capabilities, ProcessExecutor
        >>> ProcessExecutor.capabilities == Capabilities(abort=True, respawn=True, pickles_factories=True)
        True
    """

    abort: bool = False
    respawn: bool = False
    blocks_loop: bool = False
    pickles_factories: bool = False


class Executor(abc.ABC):
    """Runs the envs of one pool; subclasses implement ``start``, ``submit``, ``aclose``, ``kill``.

    Example:
        >>> from aenvs import AsyncEnvPool
        >>> from aenvs.executors import ThreadExecutor
        >>> AsyncEnvPool(["CartPole-v1"] * 4, executor=ThreadExecutor(envs_per_worker=2))
        AsyncEnvPool(num_envs=4, executor='thread', not started)
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()
    # whether the workers' plain answers to a command come as one packed record (held by
    # _push_packed): a lockstep receive then waits for them whole (see whole_due)
    packs_answers: ClassVar[bool] = False

    def __init__(self) -> None:
        self.buffers: Buffers | None = None
        # bounds the pool may override: building every env (None: unbounded), stopping workers
        self.startup_timeout: float | None = None
        self.close_timeout: float = 5.0
        self._completions: deque[Completion] = deque()
        # whole answers of workers held packed (see _push_packed), and how many envs they answer
        self._packed: list[Packed] = []
        self._packed_envs = 0
        self._wakes = 0  # wake() calls: a wait_whole returns on one
        self._packed_taken = 0  # polls that unpacked held answers: a wait_whole returns on one
        self._ready: asyncio.Event | None = None
        self._incoming: list[Completion] = []
        self._incoming_lock = threading.Lock()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the contract -------------------------------------------------------------

    @abc.abstractmethod
    async def start(
        self,
        env_fns: Sequence[EnvFn],
        *,
        seeds: Sequence[int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[EnvSpec]:
        """Build every env in its worker, allocate ``self.buffers``; return one spec per env.

        Raises EnvError naming the first env that could not be built; leaves nothing running then.
        """

    @abc.abstractmethod
    def submit(self, command: Command) -> None:
        """Hand ``command`` to the workers hosting its envs. Never blocks, never awaits."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop every worker gracefully within the executor's bound, then :meth:`kill` what is left."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop everything now. Synchronous, idempotent, safe from ``__del__``."""

    def flush(self) -> None:
        """Start now what :meth:`submit` left for the loop's next turn (the pool calls this
        when it is about to wait for the results anyway). Never blocks on other workers."""
        return  # most executors start every command at once

    def runs_now(self) -> bool:
        """Whether :meth:`run_now` may run a command here and now: only the inline executor
        does, when every env is plain and nothing is queued or held for the pool. A
        whole-batch call then runs its command where it sends it, with no queue between."""
        return False

    def run_now(self, command: Command) -> Packed | None:
        """Run ``command`` to its end now (only where :meth:`runs_now` holds): its answers
        in one packed record when every env answered plainly; else None, and they come
        through :meth:`poll` as usual."""
        raise NotImplementedError(f"the {self.name} executor does not run commands in the caller")

    def run_whole(self, kind: CommandKind, num_envs: int) -> Packed | None:
        """The answers of a command of ``kind`` to all ``num_envs`` envs, in one packed record,
        if the executor has them now and nothing else (the inline executor runs its queued
        command then); None otherwise, and they come through :meth:`poll` as usual. The
        pool calls it for a lockstep receive of a whole batch.

        The default hands over the workers' answers held packed (:meth:`_push_packed`)
        when they answer all ``num_envs`` envs, all of ``kind``, and nothing else is queued.
        """
        packed = self._packed
        if self._packed_envs != num_envs or self._completions or any(p[0] is not kind for p in packed):
            return None
        self._packed, self._packed_envs = [], 0
        if len(packed) == 1:
            return packed[0]
        indices = [i for p in packed for i in p[1]]
        return (kind, indices, b"".join(p[2] for p in packed), b"".join(p[3] for p in packed))

    def whole_due(self, kind: CommandKind, num_envs: int) -> bool:
        """Whether what is queued so far is only packed answers of ``kind``, fewer than
        ``num_envs``: a whole-batch receive may wait for the rest (:meth:`wait_whole`)."""
        return (
            self.packs_answers
            and self._packed_envs < num_envs
            and not self._completions
            and all(p[0] is kind for p in self._packed)
        )

    async def wait_whole(self, num_envs: int) -> None:
        """Return once answers of ``num_envs`` envs are held packed, a completion is queued,
        :meth:`poll` took the answers held, or :meth:`wake` is called. Consumes nothing."""
        ready, wakes, taken = self._ready_event(), self._wakes, self._packed_taken
        while (
            self._packed_envs < num_envs
            and not self._completions
            and self._wakes == wakes
            and self._packed_taken == taken
        ):
            ready.clear()
            await ready.wait()

    def wait_outside_loop(self, timeout: float) -> None:
        """Wait in the loop's thread, while the loop is not running, until a completion is
        queued or ``timeout`` seconds pass, reading what the loop would read for it. A sync
        caller waiting for a result skips the loop's turn this way (the sync shim's private
        loop driver). This base returns at once: its results reach it through the loop.
        """
        return

    # -- restarts: the pool's on_error="restart" and its per-command timeouts ---------

    def counters(self) -> dict[str, int]:
        """The executor's own counters for :meth:`AsyncEnvPool.stats` (e.g. ``abandoned_threads``)."""
        return {}

    def worker_alive(self, env_index: int) -> bool:
        """Whether the worker hosting ``env_index`` still runs commands (else :meth:`respawn` it)."""
        return True

    def abort(self, env_indices: Sequence[int]) -> None:
        """Give up on the commands in flight for these envs (they outlived a timeout).

        Stops the workers hosting them now (cancels the coroutine env's task, abandons the
        thread, sends the process SIGTERM, asks the actor to cancel its commands) and
        answers every command still in flight on those workers with a crash
        (:meth:`RemoteError.worker_died`); nothing those workers send later is delivered.
        Their envs still close once (docs/guide/clean-up.md): the process or actor is
        killed when its envs closed, or ``close_timeout`` later. Their envs need
        :meth:`respawn` before they run commands again. Never blocks.
        """
        raise NotImplementedError(f"the {self.name} executor cannot abort a command in flight")

    async def respawn(self, env_indices: Sequence[int]) -> list[int]:
        """Replace the dead workers hosting these envs by new ones; return every env index rebuilt.

        A new worker builds all the envs its predecessor hosted from their factories,
        into the same buffer rows (their layouts must equal the old specs), so a worker's
        other envs come back too. Raises EnvError naming an env whose factory failed;
        that worker stays dead.
        """
        raise NotImplementedError(f"the {self.name} executor cannot replace its workers")

    def poll(self) -> list[Completion]:
        """Every completion ready now (maybe none). Never blocks."""
        if self._packed:
            packed, self._packed, self._packed_envs = self._packed, [], 0
            self._packed_taken += 1
            if self._ready is not None:
                self._ready.set()  # a wait_whole re-checks: what it waits for went the usual way
            items = [c for p in packed for c in unpack(p)]
            items += self._completions
            self._completions.clear()
            return items
        if not self._completions:
            return []
        items = list(self._completions)
        self._completions.clear()
        return items

    async def wait_ready(self) -> None:
        """Return once :meth:`poll` would return something, or when :meth:`wake` is called.

        Consumes nothing. Several tasks may wait at once (a receive, a call, a restart):
        each wakes when completions arrive, even if another one polls them first, and
        checks its own condition again.
        """
        if self._completions or self._packed:
            return
        ready = self._ready_event()
        ready.clear()
        await ready.wait()

    def wake(self) -> None:
        """Wake every ``wait_ready`` and ``wait_whole`` (the pool calls this when it closes)."""
        self._wakes += 1
        self._ready_event().set()

    # -- helpers for subclasses ----------------------------------------------------

    async def _await_built(self, built: Sequence[tuple[list[int], asyncio.Future[Any]]]) -> list[Any]:
        """Wait for workers to build their envs (``(env indices, future)`` each), within
        ``startup_timeout``; raise the first failure, or EnvTimeoutError naming an env of the
        first worker still building."""
        futures = [future for _, future in built]
        for future in futures:
            # Every failure counts as seen, whether it is the one raised here, another, or one
            # that comes after this wait was cancelled (the pool closed during a restart: the
            # worker's stop fails its future). asyncio logs an unseen one from the future's
            # finalizer ("exception was never retrieved"), whenever the garbage collector runs.
            future.add_done_callback(_retrieve)
        _, pending = await asyncio.wait(futures, timeout=self.startup_timeout)
        if pending:
            stuck = next(envs for envs, future in built if future in pending)
            for future in pending:
                future.cancel()
            raise EnvTimeoutError(
                stuck[0],
                "make",
                message=f"env {stuck[0]} was not built within startup_timeout={self.startup_timeout} s "
                f"on the {self.name} executor (its worker hosts envs {stuck})",
                executor=self.name,
            )
        return [future.result() for future in futures]  # the first failure raises

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _ready_event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    def _push(self, completions: Sequence[Completion]) -> None:
        """Queue completions; call on the loop's thread."""
        self._completions.extend(completions)
        if self._ready is not None:
            self._ready.set()

    def _wakes_a_waiter(self) -> bool:
        """Whether what is queued wakes a waiter: a completion, or packed answers that set the
        ready event since a ``wait_whole`` last cleared it (one still waiting for the rest
        has cleared it)."""
        if self._completions:
            return True
        ready = self._ready
        return bool(self._packed) and (ready is None or ready.is_set())

    def _push_packed(self, answers: Packed) -> None:
        """Hold a worker's packed answers (call on the loop's thread): whole for a lockstep
        receive (:meth:`run_whole`), else unpacked by :meth:`poll`."""
        self._packed.append(answers)
        self._packed_envs += len(answers[1])
        if self._ready is not None:
            self._ready.set()

    def _push_one(self, completion: Completion) -> None:
        """Queue one completion; call on the loop's thread (``_push`` without a sequence to build)."""
        self._completions.append(completion)
        ready = self._ready
        if ready is not None and not ready.is_set():
            ready.set()

    def _push_threadsafe(self, completions: Sequence[Completion]) -> None:
        """Queue completions from any thread; wakes the loop at most once per batch of pushes."""
        with self._incoming_lock:
            self._incoming.extend(completions)
            if self._wake_pending:
                return
            self._wake_pending = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._flush_incoming)
        except RuntimeError:  # the loop closed meanwhile: nobody is left to receive
            pass

    def _flush_incoming(self) -> None:
        with self._incoming_lock:
            items, self._incoming = self._incoming, []
            self._wake_pending = False
        self._push(items)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark ``future``'s error as seen (whoever awaits it still gets it)."""
    if not future.cancelled():
        future.exception()

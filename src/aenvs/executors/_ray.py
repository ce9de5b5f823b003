"""The ray executor: envs in Ray actors, on this machine or across a Ray cluster.

```
  pool (event loop)                                      Ray actor k (aenvs.executors._ray_host)
  ─────────────────                                      ──────────────────────────────────────
  submit: actor.execute.remote(command, action rows) ──► write the actions into its rows,
                                                          step its envs (a thread per plain env)
  ObjectRef future done ─► loop: copy the result rows ◄── (completions, result rows) as numpy,
        into executor.buffers, queue the completions      through Ray's object store when large
  actor.lifetime.remote() fails ─► EnvCrashedError for every env the actor hosted
```

Nothing home-made travels between machines: commands, actions and results are Ray
calls and their return values; Ray places the actors (spread over the nodes by
default), reports their deaths, and never retries a step (``max_task_retries=0``,
``max_restarts=0``): the pool's ``on_error="restart"`` replaces a dead actor.
Results are awaited through each ObjectRef's future, whose completion Ray reports to
the event loop: no ``ray.get`` blocks the loop, no thread polls.

Ray is imported only when this executor is built (``pip install 'aenvs[ray]'``); how
pools share this process's connection to Ray is :mod:`aenvs.executors._ray_runtime`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import pickle
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._errors import EnvCrashedError, EnvTimeoutError
from aenvs._specs import OBJECT, EnvSpec, Key
from aenvs.executors._base import Capabilities
from aenvs.executors._pickling import cloudpickle_dumps
from aenvs.executors._ray_host import EnvHost, Result
from aenvs.executors._ray_runtime import RUNTIME, import_ray, init_options as ray_init_options
from aenvs.executors._workers import WorkerGroupExecutor

__all__ = ["RayExecutor"]

_WITH_ACTIONS = (CommandKind.STEP, CommandKind.STEP_AND_RESET)


# -- the executor ----------------------------------------------------------------------


_Plan = list[tuple[int, int, npt.NDArray[np.intp]]]
"""Per group of an actor: its group, the pool's group, the pool's rows (see ``RayExecutor._plan``)."""


@dataclass(eq=False)
class _Actor:
    """One actor of the pool and what the driver knows of it."""

    index: int
    env_indices: list[int]
    name: str = ""
    handle: Any = None
    pid: int = 0
    node: str = ""  # the address of its node
    node_id: str = ""
    alive: bool = True
    in_flight: dict[int, CommandKind] = field(default_factory=dict[int, CommandKind])
    ended: asyncio.Future[None] | None = None  # resolved when Ray reports the actor dead
    # env -> its (group, row) in the actor
    location: dict[int, tuple[int, int]] = field(default_factory=dict[int, tuple[int, int]])
    plans: dict[tuple[int, ...], _Plan] = field(default_factory=dict[tuple[int, ...], _Plan])

    def describe(self, why: str) -> str:
        where = f"pid {self.pid} on {self.node}" if self.pid else "not started"
        return f"Ray actor {self.name} ({where}) hosting envs {self.env_indices} {why}"


class RayExecutor(WorkerGroupExecutor[_Actor]):
    """Runs envs in Ray actors, ``envs_per_worker`` envs per actor.

    Args:
        num_workers: actors (default: the cluster's CPUs, at most one per env).
        envs_per_worker: envs per actor instead (overrides ``num_workers``).
        address: the Ray cluster to connect to when this process is not connected yet
            (default: ``RAY_ADDRESS``, else a local Ray instance started for the pools of
            this process and shut down when the last one closes).
        num_cpus: CPUs each actor reserves (default: Ray's, one to be placed, none held).
        resources: custom resources each actor asks for, e.g. ``{"simulator": 1}``.
        runtime_env: Ray runtime environment of the actors (packages, env vars, working dir).
        scheduling_strategy: where Ray places the actors: ``"SPREAD"`` (default: over the
            nodes), ``"DEFAULT"``, or a Ray strategy object (placement group, node affinity).
        concurrent_envs: step the plain envs of one actor on threads of their own, so that
            envs waiting on I/O overlap (``False``: one after the other, cheaper for
            CPU-bound envs). ``async def`` envs always run concurrently.
        init_options: keyword arguments for the ``ray.init`` this executor makes when Ray
            is not initialized (default for a local instance: all CPUs, no dashboard).
        startup_timeout: seconds the actors may take to build their envs, once started.
        actor_timeout: seconds Ray may take to place and start the actors.
        close_timeout: seconds ``aclose`` waits for actors to close their envs, then to die.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> from aenvs.executors import RayExecutor
        >>> async def main():
        ...     executor = RayExecutor(num_workers=2, num_cpus=1)  # 2 actors, 4 envs each
        ...     async with AsyncEnvPool(["CartPole-v1"] * 8, executor=executor) as pool:
        ...         return (await pool.reset())["observation"].shape
        >>> asyncio.run(main())  # doctest: +SKIP
        torch.Size([8, 4])
    """

    name = "ray"
    capabilities = Capabilities(abort=True, respawn=True, pickles_factories=True)

    def __init__(
        self,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        address: str | None = None,
        num_cpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        scheduling_strategy: Any = "SPREAD",
        concurrent_envs: bool = True,
        init_options: Mapping[str, Any] | None = None,
        startup_timeout: float | None = 60.0,
        actor_timeout: float = 120.0,
        close_timeout: float = 5.0,
    ) -> None:
        super().__init__(num_workers, envs_per_worker, startup_timeout, close_timeout)
        self._ray = import_ray()
        self.address = address
        self.num_cpus = num_cpus
        self.resources = dict(resources) if resources else None
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.scheduling_strategy = scheduling_strategy
        self.concurrent_envs = concurrent_envs
        self.init_options = dict(init_options) if init_options else None
        self.actor_timeout = actor_timeout
        self._id = uuid.uuid4().hex[:8]
        self._generation = itertools.count()
        self._host: Any = None
        self._joined = False  # counted as a user of the Ray connection aenvs made
        # actors given up on (a timeout), closing their envs before they are killed
        self._dying: dict[_Actor, asyncio.Future[Any]] = {}

    @property
    def pids(self) -> list[int]:
        """Process ids of the actors (on their nodes), for monitoring and fault injection."""
        return [w.pid for w in self._workers if w.pid]

    @property
    def nodes(self) -> dict[int, str]:
        """The Ray node id hosting each env (by env index)."""
        return {i: w.node_id for w in self._workers for i in w.env_indices}

    @property
    def actor_names(self) -> list[str]:
        """Names of the pool's actors (``ray.util.list_named_actors`` shows them while alive)."""
        return [w.name for w in self._workers]

    # -- start ------------------------------------------------------------------------

    def _new_worker(self, index: int, env_indices: list[int]) -> _Actor:
        return _Actor(index, env_indices)

    async def _prepare(self) -> None:
        options = ray_init_options(self.address, self.init_options)
        joined, ready = await asyncio.to_thread(RUNTIME.acquire, self._ray, options)
        self._joined = joined
        await asyncio.wrap_future(ready)

    def _default_workers(self, num_envs: int) -> int:
        return int(self._ray.cluster_resources().get("CPU", 1)) or 1

    async def _give_up(self) -> None:
        await self._abandon()

    def _host_class(self) -> Any:
        if self._host is None:
            self._host = self._ray.remote(EnvHost)
        return self._host

    async def _start_workers(self, workers: list[_Actor]) -> dict[int, EnvSpec]:
        loop = self._loop
        assert loop is not None
        num_envs = len(self._recipe[0])
        options: dict[str, Any] = {
            "max_restarts": 0,
            "max_task_retries": 0,  # a step is never run twice behind the user's back
            "scheduling_strategy": self.scheduling_strategy,
        }
        if self.num_cpus is not None:
            options["num_cpus"] = self.num_cpus
        if self.resources:
            options["resources"] = self.resources
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        host = self._host_class()
        for w in workers:
            payload = cloudpickle_dumps((self._recipe_of(w), list(sys.path)))
            w.name = f"aenvs-{self._id}-{w.index}-{next(self._generation)}"
            w.handle = host.options(name=w.name, **options).remote(
                payload, w.index, num_envs, self.concurrent_envs
            )
            w.ended = loop.create_future()
            self._when_done(w.handle.lifetime.remote(), self._on_lifetime_end, w)
        # Ray places and starts the actors (the factories are unpickled meanwhile) ...
        started = {w: self._future(w.handle.ready.remote()) for w in workers}
        _, pending = await asyncio.wait(started.values(), timeout=self.actor_timeout)
        for w, future in started.items():
            if future in pending:
                future.cancel()
                raise EnvTimeoutError(
                    w.env_indices[0],
                    "make",
                    message=f"the Ray actor for envs {w.env_indices} did not start within "
                    f"actor_timeout={self.actor_timeout} s on the ray executor: does a node have the "
                    f"resources it asks for (num_cpus={self.num_cpus}, resources={self.resources})?",
                    executor=self.name,
                )
            failure = future.exception()
            if failure is not None:
                raise self._startup_crash(w, failure)
            w.pid, w.node, w.node_id = future.result()
        # ... then build the envs, within startup_timeout
        built = await self._await_built(
            [(w.env_indices, asyncio.ensure_future(self._build(w))) for w in workers]
        )
        specs_by_env: dict[int, EnvSpec] = {}
        for w, (specs, groups) in zip(workers, built, strict=True):
            specs_by_env.update(specs)
            w.location = {i: (g, row) for g, members in enumerate(groups) for row, i in enumerate(members)}
        return specs_by_env

    async def _build(self, w: _Actor) -> tuple[dict[int, EnvSpec], list[list[int]]]:
        try:
            tag, value = await self._future(w.handle.build.remote(w.env_indices[0], self.close_timeout))
        except self._ray.exceptions.RayError as exc:
            raise self._startup_crash(w, exc) from None
        if tag == "failed":
            raise value
        return pickle.loads(value)

    def _startup_crash(self, w: _Actor, exc: BaseException) -> EnvCrashedError:
        description = w.describe(f"died while starting: {_reason(exc)}")
        return EnvCrashedError(
            w.env_indices[0], "make", f"EnvCrashedError: {description}\n", executor=self.name
        )

    # -- Ray futures on the loop ---------------------------------------------------------

    def _future(self, ref: Any) -> asyncio.Future[Any]:
        future = asyncio.wrap_future(ref.future(), loop=self._loop)
        # an answer nobody waits for any more (a close after a kill, a start given up) fails
        # quietly instead of logging "exception was never retrieved"
        future.add_done_callback(_retrieve)
        return future

    def _when_done(self, ref: Any, callback: Callable[..., None], *args: Any) -> None:
        """Call ``callback(*args, future)`` on the loop once ``ref`` is done (Ray reports it)."""
        loop = self._loop
        assert loop is not None

        def done(future: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(callback, *args, future)

        ref.future().add_done_callback(done)

    # -- commands -----------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        kind = command.kind
        for w, part in self._split(command):
            envs = part.env_indices
            plan = self._plan(w, envs)
            actions = None
            if kind in _WITH_ACTIONS:
                assert self.buffers is not None
                groups = self.buffers.groups
                # the fixed-shape rows; non-tensor actions travel in the command itself
                actions = [
                    (g, {key: b[rows] for key, b in groups[pool_group].action.items() if b.dtype != OBJECT})
                    for g, pool_group, rows in plan
                ]
            ref = w.handle.execute.remote(part, actions)
            for i in envs:
                w.in_flight[i] = kind
            self._when_done(ref, self._arrived, w, kind, envs, plan)

    def _plan(self, w: _Actor, envs: list[int]) -> _Plan:
        """Per group of the actor holding some of ``envs``: (its group, the pool's group, the
        pool's rows), in the order the actor lists the rows (``ray_host.rows_by_group``)."""
        key = tuple(envs)
        plan = w.plans.get(key)
        if plan is None:
            assert self.buffers is not None
            location = self.buffers.location
            members: dict[int, list[int]] = {}
            for i in envs:
                members.setdefault(w.location[i][0], []).append(i)
            plan = [
                (g, location[ids[0]][0], np.array([location[i][1] for i in ids], dtype=np.intp))
                for g, ids in sorted(members.items())
            ]
            if len(w.plans) < 64:  # the same few subsets come back step after step
                w.plans[key] = plan
        return plan

    def _arrived(
        self,
        w: _Actor,
        kind: CommandKind,
        envs: list[int],
        plan: _Plan,
        future: concurrent.futures.Future[Result],
    ) -> None:
        if not w.alive or self._closing:  # its envs were answered with a crash already
            return
        written: list[tuple[int, dict[str, dict[Key, np.ndarray]]]]
        try:
            answer, written = future.result()
            completions = pickle.loads(answer)
        except self._ray.exceptions.RayActorError as exc:
            self._lost(w, exc)
            return
        except Exception as exc:  # the answer could not be read, or aenvs' own code failed in the actor
            error = RemoteError.capture(exc)
            completions, written = [Completion(i, kind, error=error) for i in envs], []
        if written:
            assert self.buffers is not None
            groups = self.buffers.groups
            for (_, parts), (_, pool_group, rows) in zip(written, plan, strict=True):
                target = groups[pool_group]
                for part, leaves in parts.items():
                    buffers = target.reset if part == "reset" else target.step
                    for key, values in leaves.items():
                        buffers[key][rows] = values
        in_flight = w.in_flight
        for c in completions:
            in_flight.pop(c.env_index, None)
        self._push(completions)

    # -- deaths and restarts ----------------------------------------------------------------

    def _on_lifetime_end(self, w: _Actor, future: concurrent.futures.Future[Any]) -> None:
        if w.ended is not None and not w.ended.done():
            w.ended.set_result(None)
        exc = None if future.cancelled() else future.exception()
        self._lost(w, exc if exc is not None else "ended")

    def _lost(self, w: _Actor, why: BaseException | str) -> None:
        """``w`` died (or cannot be trusted to answer): every command in flight on it is a crash."""
        if not w.alive:
            return
        w.alive = False
        # ActorUnavailableError: it may come back, and must not answer (or step) again
        self._kill(w)
        self._crash_in_flight(w, why if isinstance(why, str) else f"died: {_reason(why)}")

    def _describe(self, worker: _Actor, why: str) -> str:
        return worker.describe(why)

    def _stop(self, worker: _Actor, why: str) -> None:
        """Give up on ``worker`` now (its commands in flight are a crash), but let it close its
        envs first: its ``close`` cancels the commands under way and closes every env; the
        actor is killed when that returns, or after ``close_timeout`` (a plain env stuck in a
        step holds the actor's loop: its env cannot close)."""
        if not worker.alive or worker.handle is None or self._closing:
            self._lost(worker, why)
            return
        worker.alive = False
        self._crash_in_flight(worker, why)
        loop = self._loop
        assert loop is not None
        closing = self._future(worker.handle.close.remote())
        timer = loop.call_later(self.close_timeout, self._kill, worker)

        def closed(_: asyncio.Future[Any]) -> None:
            timer.cancel()
            self._kill(worker)
            self._dying.pop(worker, None)

        closing.add_done_callback(closed)
        self._dying[worker] = closing

    def _kill(self, w: _Actor) -> None:
        if w.handle is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(w.handle, no_restart=True)

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        self._closing = True
        try:
            alive = [w for w in self._workers if w.alive and w.handle is not None]
            dying = list(self._dying.values())  # given up on before, closing their envs
            if alive or dying:
                closing = [self._future(w.handle.close.remote()) for w in alive]
                await asyncio.wait(closing + dying, timeout=self.close_timeout)
                for w in alive:
                    self._kill(w)
                ends = [w.ended for w in alive if w.ended is not None and not w.ended.done()]
                if ends:  # Ray reports each death: no actor of ours is left once aclose returns
                    await asyncio.wait(ends, timeout=self.close_timeout)
        finally:
            await self._abandon()

    async def _abandon(self) -> None:
        """Kill every actor still alive, then leave Ray (waiting for its shutdown if this was the last user)."""
        self._closing = True
        self._kill_actors()
        stopped = self._leave()
        if stopped is not None:
            await asyncio.to_thread(stopped.wait, 30)

    def _leave(self) -> threading.Event | None:
        if not self._joined:
            return None
        self._joined = False
        return RUNTIME.release()

    def kill(self) -> None:
        self._closing = True
        self._kill_actors()
        self._leave()

    def _kill_actors(self) -> None:
        dying, self._dying = list(self._dying), {}
        if not sys.is_finalizing() and self._ray.is_initialized():
            for w in self._workers:
                if w.alive:
                    self._kill(w)
            for w in dying:
                self._kill(w)
        for w in self._workers:
            w.alive = False


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _reason(exc: BaseException) -> str:
    """Ray's error, shortened to its first line and the line saying why an actor died."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    why = [line for line in lines[1:] if "because" in line or "died" in line]
    return " ".join([f"{type(exc).__name__}: {lines[0]}", *why[:1]])

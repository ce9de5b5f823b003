"""What runs inside the Ray actors of the ray executor: some envs of a pool, one runner.

An :class:`EnvHost` is an async Ray actor. It hosts ``envs_per_worker`` envs in an
:class:`~aenvs._runner.EnvRunner` (the runner every executor hosts), writes results into
buffers of its own (one row per env, laid out like the pool's) and answers each command
with its completions plus the rows it wrote, as numpy arrays that Ray carries (through
its object store when they are large). Plain envs of one actor step on threads of their
own, so envs that wait on I/O overlap; ``async def`` envs run on the actor's event loop.

This module imports neither ray nor torch: an actor hosting gymnasium envs stays small.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

import numpy as np

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._errors import EnvError
from aenvs._runner import EnvRunner, answers, drive
from aenvs._specs import Key
from aenvs._worker import WORKER_ENV_VAR

__all__ = ["PARTS", "EnvHost", "GroupArrays", "Result", "rows_by_group"]

GroupArrays = list[tuple[int, dict[Key, np.ndarray]]]
"""Per buffer group of an actor (by index): one array per leaf, a row per env of the command."""

Result = tuple[bytes, list[tuple[int, dict[str, dict[Key, np.ndarray]]]]]
"""An actor's answer to a command: its completions (pickled), and per group the parts it wrote.

The completions travel pickled, not as Ray values: what Ray deserializes shares its
buffers read-only, and a call's or an info's arrays must reach the caller as they do on
the other executors. The result rows travel as Ray values (no copy beyond Ray's own):
the driver copies them into its buffers."""

# which parts of the buffers a command writes, and so travel back with its answer
PARTS: dict[CommandKind, tuple[str, ...]] = {
    CommandKind.RESET: ("reset",),
    CommandKind.STEP: ("step",),
    CommandKind.STEP_AND_RESET: ("step", "reset"),
}


def rows_by_group(
    env_indices: Sequence[int], location: Mapping[int, tuple[int, int]]
) -> list[tuple[int, list[int]]]:
    """The rows of ``env_indices`` in each group (``location``: env -> (group, row)), in their order.

    Example:
        >>> rows_by_group([4, 2, 3], {2: (0, 0), 3: (1, 0), 4: (0, 1)})
        [(0, [1, 0]), (1, [0])]
    """
    groups: dict[int, list[int]] = {}
    for i in env_indices:
        group, row = location[i]
        groups.setdefault(group, []).append(row)
    return sorted(groups.items())


class EnvHost:
    """A Ray actor (the executor wraps it with ``ray.remote``) hosting some envs of a pool.

    Args:
        payload: the cloudpickled ``(factories, seeds, make kwargs)`` of its envs, by env index,
            and the driver's ``sys.path`` (appended here: factories from the driver's modules,
            test modules included, unpickle as they do in process workers).
        worker_index: the actor's index among the pool's workers (``EnvContext.worker_index``).
        num_envs: the pool's number of envs.
        concurrent: step plain envs on threads of their own (else one after the other).

    Example, as :class:`~aenvs.executors.RayExecutor` starts one (in a Ray actor, so not run here;
    tests/executors/test_ray.py runs it):

    ```python
    recipe = cloudpickle.dumps(({0: "CartPole-v1"}, {0: None}, {0: None}))  # factories, seeds, make kwargs
    host = ray.remote(EnvHost).remote(cloudpickle.dumps((recipe, sys.path)), 0, 1)
    status, built = ray.get(host.build.remote(0))  # ("built", ...) or ("failed", EnvError)
    ```
    """

    def __init__(self, payload: bytes, worker_index: int, num_envs: int, concurrent: bool = True) -> None:
        os.environ[WORKER_ENV_VAR] = "ray"  # this process hosts envs only (see aenvs.testing)
        self._worker_index = worker_index
        self._num_envs = num_envs
        self._concurrent = concurrent
        self._runner: EnvRunner | None = None
        self._buffers: Buffers | None = None
        self._location: dict[int, tuple[int, int]] = {}
        self._threads: ThreadPoolExecutor | None = None
        self._recipe: tuple[Any, Any, Any] | None = None
        self._unpickled: RemoteError | None = None
        self._first_env = -1
        self._running: set[asyncio.Task[Any]] = set()  # the execute calls under way
        self._close_timeout: float | None = None
        try:
            # unpickling imports what the factories need (torch, a simulator): done here,
            # while Ray starts the actor, so that building envs is all startup_timeout bounds
            recipe, driver_path = pickle.loads(payload)  # cloudpickle's loads is pickle's
        except Exception as exc:
            self._unpickled = RemoteError.capture(exc)
            return
        sys.path.extend(p for p in driver_path if p not in sys.path)
        try:
            self._recipe = pickle.loads(recipe)
        except Exception as exc:
            self._unpickled = RemoteError.capture(exc)

    async def ready(self) -> tuple[int, str, str]:
        """The actor's process id, and the address and id of its node."""
        import ray  # present in every actor's process

        address = cast(str, ray.util.get_node_ip_address())  # pyright: ignore[reportUnknownMemberType]
        return os.getpid(), address, ray.get_runtime_context().get_node_id()

    async def lifetime(self) -> None:
        """Never returns: the driver learns of this actor's death when this call fails."""
        await asyncio.Event().wait()

    async def build(self, first_env: int, close_timeout: float | None = None) -> tuple[str, Any]:
        """Build the envs: ``("built", pickled ({env: spec}, [[envs of each buffer group]]))`` or
        ``("failed", EnvError)``. ``close_timeout`` bounds each async env's close."""
        self._first_env = first_env
        self._close_timeout = close_timeout
        if self._recipe is None:
            assert self._unpickled is not None
            error = self._unpickled
            return "failed", EnvError(first_env, "make", error.traceback, error.exc_type)
        env_fns, seeds, make_kwargs = self._recipe
        build = partial(
            EnvRunner.build,
            env_fns,
            num_envs=self._num_envs,
            worker_index=self._worker_index,
            seeds=seeds,
            make_kwargs=make_kwargs,
        )
        try:  # on a thread: the actor keeps answering (close, lifetime) while a constructor runs
            runner = await asyncio.get_running_loop().run_in_executor(None, build)
        except EnvError as err:
            return "failed", err
        runner.close_timeout = close_timeout
        envs = runner.env_indices
        self._buffers = buffers = Buffers.allocate([runner.specs[i] for i in envs])
        runner.attach({i: buffers.rows(k) for k, i in enumerate(envs)})
        self._location = {i: buffers.location[k] for k, i in enumerate(envs)}
        self._runner = runner
        if self._concurrent and len(envs) > 1:
            self._threads = ThreadPoolExecutor(len(envs), thread_name_prefix="aenvs-env")
        groups = [[envs[k] for k in group.env_indices] for group in buffers.groups]
        return "built", pickle.dumps((runner.specs, groups), protocol=pickle.HIGHEST_PROTOCOL)

    async def execute(self, command: Command, actions: GroupArrays | None) -> Result:
        """Run ``command`` on its envs (writing ``actions`` into their rows first); return the
        completions and, per buffer group, the rows the command wrote."""
        runner, buffers = self._runner, self._buffers
        assert runner is not None and buffers is not None
        groups = rows_by_group(command.env_indices, self._location)
        if actions:
            rows = dict(groups)
            for group, leaves in actions:
                target = buffers.groups[group].action
                for key, values in leaves.items():
                    target[key][rows[group]] = values
        task = asyncio.current_task()
        assert task is not None  # Ray runs each call of an async actor in a task
        self._running.add(task)
        try:
            completions = await self._run(runner, command)
        finally:
            self._running.discard(task)
        parts = PARTS.get(command.kind, ())
        written: list[tuple[int, dict[str, dict[Key, np.ndarray]]]] = []
        if parts:
            for group, rows_of in groups:
                source = buffers.groups[group]
                written.append(
                    (
                        group,
                        {part: {k: b[rows_of] for k, b in getattr(source, part).items()} for part in parts},
                    )
                )
        try:
            answer = pickle.dumps(completions, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an env returned something that cannot travel: its result becomes an error
            error = RemoteError.capture(exc)
            answer = pickle.dumps([Completion(c.env_index, c.kind, error=error) for c in completions])
        return answer, written

    async def _run(self, runner: EnvRunner, command: Command) -> list[Completion]:
        indices = command.env_indices
        threads = self._threads
        if threads is None:  # one env, or concurrent=False: on the actor's loop
            if runner.has_async:
                return await runner.execute_async(command)
            return runner.run_plain(command)
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(
                runner.execute_one(i, command)
                if runner.is_async(i)
                else loop.run_in_executor(threads, drive, runner.execute_one(i, command))
                for i in indices
            ),
            return_exceptions=True,
        )
        return answers(command, results)

    async def close(self) -> None:
        """Close every env (the driver kills the actor afterwards): the commands under way are
        cancelled first (an async env's step gets the cancellation; a plain env's step on a
        thread runs on), within ``close_timeout``, then each env's close runs once."""
        runner, self._runner = self._runner, None
        running = [task for task in self._running if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=self._close_timeout)
        if runner is not None:
            await runner.aclose()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

"""``aenvs.collect``: a streaming collector over a pool, iterated with ``async for`` or ``for``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, Literal, Self, TypeVar, cast, overload

from aenvs._collect.driver import Driver, Settings
from aenvs._collect.outputs import Episode, FrameBatch
from aenvs._collect.plan import EpisodePlan, Tasks, check_tasks
from aenvs._collect.policy import Policy
from aenvs._collect.running import Running
from aenvs._errors import EnvBusyError, EnvError, PoolClosedError
from aenvs._pool import AsyncEnvPool
from aenvs._pool.holding import acting_context
from aenvs._sync import BatchedEnv

__all__ = ["Collector", "collect"]

T = TypeVar("T", Episode, FrameBatch, Episode | FrameBatch)


@overload
def collect(
    pool: AsyncEnvPool | BatchedEnv,
    policy: Policy,
    *,
    frames_per_batch: None = None,
    episodes: Literal[True] | None = None,
    max_batch: int | None = None,
    max_wait: float | None = None,
    max_policy_calls: int = 2,
    tasks: Tasks | None = None,
    total_episodes: int | None = None,
    episodes_per_env: int | None = None,
    total_frames: int | None = None,
    on_env_error: Literal["raise", "skip"] = "raise",
) -> Collector[Episode]: ...


@overload
def collect(
    pool: AsyncEnvPool | BatchedEnv,
    policy: Policy,
    *,
    frames_per_batch: int,
    episodes: Literal[False] | None = None,
    max_batch: int | None = None,
    max_wait: float | None = None,
    max_policy_calls: int = 2,
    tasks: Tasks | None = None,
    total_episodes: int | None = None,
    episodes_per_env: int | None = None,
    total_frames: int | None = None,
    on_env_error: Literal["raise", "skip"] = "raise",
) -> Collector[FrameBatch]: ...


@overload
def collect(
    pool: AsyncEnvPool | BatchedEnv,
    policy: Policy,
    *,
    frames_per_batch: int,
    episodes: Literal[True],
    max_batch: int | None = None,
    max_wait: float | None = None,
    max_policy_calls: int = 2,
    tasks: Tasks | None = None,
    total_episodes: int | None = None,
    episodes_per_env: int | None = None,
    total_frames: int | None = None,
    on_env_error: Literal["raise", "skip"] = "raise",
) -> Collector[Episode | FrameBatch]: ...


def collect(
    pool: AsyncEnvPool | BatchedEnv,
    policy: Policy,
    *,
    frames_per_batch: int | None = None,
    episodes: bool | None = None,
    max_batch: int | None = None,
    max_wait: float | None = None,
    max_policy_calls: int = 2,
    tasks: Tasks | None = None,
    total_episodes: int | None = None,
    episodes_per_env: int | None = None,
    total_frames: int | None = None,
    on_env_error: Literal["raise", "skip"] = "raise",
) -> Collector[Any]:
    """Keep every env of ``pool`` busy under ``policy`` and yield what completes.

    The collector resets each env (with its task), then loops: the envs whose results are
    ready are batched for the policy, the policy is called, each env gets its action as soon
    as the policy answers, and ended episodes start again. A batch closes when a policy call
    slot is free (``max_policy_calls`` calls run at once), at ``max_batch`` envs, or after
    ``max_wait`` seconds, whichever comes first: with the defaults, while the policy works the
    envs that finish wait for the next free slot and go in its batch together, which is what
    continuous-batching inference servers do and what keeps both the envs and the policy busy.

    Args:
        pool: a started :class:`~aenvs.AsyncEnvPool` (iterate with ``async for``), or a
            :class:`~aenvs.SerialEnv` / :class:`~aenvs.ParallelEnv` (iterate with ``for``).
            Its envs must have nothing in flight.
        policy: called with a TensorDict of the envs ready to act (their observations,
            ``"env_index"``, ``"episode"``); writes ``"action"`` into it, returns a TensorDict
            (or a dict of entries, a row per env) holding ``"action"`` (and anything else to
            keep, such as log-probs), or returns the actions one per row (text, numbers,
            tensors). It must leave ``"env_index"`` and ``"episode"`` as given. An ``async
            def`` policy (an inference server's client) is awaited, so policy calls overlap
            the envs' steps.
        frames_per_batch: yield :class:`FrameBatch` es of this many transitions (TorchRL's
            collectors' batches), in the order they completed.
        episodes: yield each finished :class:`Episode` (default: when ``frames_per_batch`` is
            not given). Both may be on: episodes and frame batches come in one stream.
        max_batch: at most this many envs per policy call.
        max_wait: once a slot is free and an env is ready, wait up to this many seconds for
            the batch to fill to ``max_batch`` (RLlib's ``remote_env_batch_wait_ms``).
        max_policy_calls: policy calls in flight at once.
        tasks: the task of each episode: ``tasks(env_index, episode_number_of_that_env)``, or
            an iterable of them taken as episodes start (a dataset of prompts; the collection
            ends when it is exhausted and the episodes running have finished). A task that
            is a dict is the episode's reset options; any other value (a prompt string, an
            id) is passed as ``options={"task": value}``; None resets without options.
            :attr:`Collector.unfinished_tasks` lists those taken and not handed out.
        total_episodes: episodes to run in all, then end.
        episodes_per_env: episodes to run per env, then end.
        total_frames: end after yielding this many transitions in frame batches.
        on_env_error: ``"raise"`` (an env's error ends the collection with that EnvError) or
            ``"skip"`` (its episode is dropped, its task handed out again, up to three
            episodes in all, then listed in :attr:`Collector.failed_tasks`; the env is reset
            for a new one, and an env whose reset fails gets no more episodes).

    The collector works while you wait for its next item: between two items nothing new
    starts (no policy call, no step, no task taken), so a ``break`` stops it where it is,
    however the collector is held. It holds the pool meanwhile: your next pool call (a
    ``pool.reset()``, a new collector) receives the steps it still had in flight, keeps
    their results, and stops it, so the pool is usable on the next line; ``get_attr``,
    ``call`` and ``set_attr`` only pause it. Cancelling the loop or :meth:`Collector.aclose`
    stops it at once: the steps in flight are abandoned (the pool drops their results when
    they arrive, see :meth:`AsyncEnvPool.abandon`; its whole-batch calls wait for them).

    Example:
        >>> import asyncio
        >>> import aenvs
        >>> async def main():
        ...     async with aenvs.AsyncEnvPool("CartPole-v1", num_envs=4, executor="inline") as pool:
        ...         async def policy(td):  # an inference server's client, say
        ...             return [0] * td.batch_size[0]
        ...         lengths = [e.length async for e in aenvs.collect(pool, policy, total_episodes=6)]
        ...     return len(lengths), all(n > 0 for n in lengths)
        >>> asyncio.run(main())
        (6, True)
    """
    return Collector(
        pool,
        policy,
        frames_per_batch=frames_per_batch,
        episodes=episodes,
        max_batch=max_batch,
        max_wait=max_wait,
        max_policy_calls=max_policy_calls,
        tasks=tasks,
        total_episodes=total_episodes,
        episodes_per_env=episodes_per_env,
        total_frames=total_frames,
        on_env_error=on_env_error,
    )


class Collector(Generic[T]):
    """The iterator :func:`collect` returns: ``async for`` over an AsyncEnvPool, ``for`` over a
    SerialEnv / ParallelEnv. Also an (async) context manager that stops it on exit.

    It works while you wait for its next item, and holds the pool meanwhile: your own pool
    calls take it back (see :func:`collect`).

    Attributes:
        steps: env steps recorded so far.
        episodes_started: episodes started so far.
        failed_tasks: tasks given up (``on_env_error="skip"``).
        unfinished_tasks: tasks taken whose episodes were not handed out (nor given up).

    Example:
        >>> import aenvs
        >>> with aenvs.SerialEnv(2, lambda: __import__("gymnasium").make("CartPole-v1")) as env:
        ...     batches = list(aenvs.collect(env, lambda td: [1] * td.batch_size[0], frames_per_batch=10,
        ...         total_frames=30))
        >>> [b.frames for b in batches]
        [10, 10, 10]
    """

    def __init__(
        self,
        pool: AsyncEnvPool | BatchedEnv,
        policy: Policy,
        *,
        frames_per_batch: int | None,
        episodes: bool | None,
        max_batch: int | None,
        max_wait: float | None,
        max_policy_calls: int,
        tasks: Tasks | None,
        total_episodes: int | None,
        episodes_per_env: int | None,
        total_frames: int | None,
        on_env_error: Literal["raise", "skip"],
    ) -> None:
        _check_arguments(
            frames_per_batch=frames_per_batch,
            max_batch=max_batch,
            max_wait=max_wait,
            max_policy_calls=max_policy_calls,
            total_episodes=total_episodes,
            episodes_per_env=episodes_per_env,
            total_frames=total_frames,
        )
        if on_env_error not in ("raise", "skip"):
            raise ValueError(f"on_env_error must be 'raise' or 'skip', got {on_env_error!r}")
        if total_frames is not None and frames_per_batch is None:
            raise ValueError("total_frames counts frame batches: give frames_per_batch too")
        if episodes is None:
            episodes = frames_per_batch is None
        if not episodes and frames_per_batch is None:
            raise ValueError("nothing to yield: episodes=False needs frames_per_batch")
        check_tasks(tasks)
        self._shim = pool if isinstance(pool, BatchedEnv) else None
        self._pool: AsyncEnvPool = pool.pool if isinstance(pool, BatchedEnv) else pool
        self._policy = policy
        self._settings = Settings(
            max_batch, max_wait, max_policy_calls, frames_per_batch, episodes, total_frames, on_env_error
        )
        self._plan = EpisodePlan(
            self._pool.num_envs, tasks=tasks, total_episodes=total_episodes, episodes_per_env=episodes_per_env
        )
        self._driver: Driver | None = None
        self._run: Running | None = None

    @property
    def steps(self) -> int:
        return 0 if self._driver is None else self._driver.steps

    @property
    def episodes_started(self) -> int:
        return self._plan.started

    @property
    def failed_tasks(self) -> list[Any]:
        """With ``on_env_error="skip"``: the tasks given up, after failing three episodes or
        with no env left to run them (every env's reset failed)."""
        return list(self._plan.failed)

    @property
    def unfinished_tasks(self) -> list[Any]:
        """The tasks taken (from ``tasks``) whose episodes were not handed out, in the order
        taken: the episodes running, cut short by a stop, or finished and not taken from the
        collector yet. With :attr:`failed_tasks` and the tasks of the episodes handed out,
        every task taken is in exactly one of the three; resume a dataset without a gap with
        ``tasks=itertools.chain(collector.unfinished_tasks, rest)``.

        Example:
            >>> import asyncio, itertools
            >>> import aenvs
            >>> async def main():
            ...     prompts = iter([f"p{k}" for k in range(100)])
            ...     async with aenvs.AsyncEnvPool("CartPole-v1", num_envs=4, executor="inline") as pool:
            ...         collector = aenvs.collect(pool, lambda td: [0] * td.batch_size[0], tasks=prompts)
            ...         done = []
            ...         async for episode in collector:
            ...             done.append(episode.task)
            ...             break
            ...         await pool.reset()  # takes the pool back: the collector stops
            ...         rest = itertools.chain(collector.unfinished_tasks, prompts)
            ...         done += [e.task async for e in aenvs.collect(pool, lambda td: [0] * td.batch_size[0], tasks=rest)]
            ...     return sorted(done, key=lambda p: int(p[1:])) == [f"p{k}" for k in range(100)]
            >>> asyncio.run(main())
            True
        """
        return self._plan.unfinished

    # -- async iteration -------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        run = self._run
        if run is None:
            run = await self._start()
        try:
            return cast(T, await run.next())
        except asyncio.CancelledError:
            self._stop_now()  # a cancelled consumer stops the collection: the pool is usable at once
            raise

    async def _start(self) -> Running:
        pool = self._pool
        if pool.batch_size[1:]:
            raise ValueError(
                f"the collector steps envs one by one; this pool's envs have a batch size of their own "
                f"({list(pool.batch_size[1:])})"
            )
        # a collector holding the pool stops first, or says it is in use; the envs being
        # rebuilt (on_error="restart") are waited for by the resets that start the episodes
        await pool.hold(self)
        if self._run is not None:  # started meanwhile (a second consumer)
            return self._run
        run = self._run = Running(self._plan, acting_context(self))
        self._driver = driver = Driver(pool, self._policy, self._settings, self._plan, run.put)
        run.start(driver, self._release)
        return run

    async def aclose(self) -> None:
        """Stop: policy calls cancelled, steps in flight abandoned; the pool usable. Idempotent."""
        run = self._run
        if run is not None:
            self._release()
            await run.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _stop_now(self) -> None:
        run = self._run
        if run is not None and not run.finished:
            self._release()
            run.stop_now()

    def _release(self) -> None:
        self._pool.release(self)

    # -- holding the pool (see aenvs._pool.holding) ---------------------------------------

    async def yield_pool(self, *, visit: bool) -> None:
        """Another caller's call on the pool: receive what is in flight (and keep it); then
        pause for a ``visit``, else stop. EnvBusyError for a call that is not a visit while
        a consumer waits for the next item (another task iterates the collector)."""
        run = self._run
        if run is None or run.finished:
            if not visit:
                self._release()
            return
        if not visit and run.consumers:
            raise EnvBusyError(0, _IN_USE)
        run.lend(1)
        try:
            await run.quiesce()
        except EnvError as exc:  # with on_env_error="raise": the collection ends with it
            run.fail(exc)
            self._release()
        except BaseException:
            run.lend(-1)
            raise
        if not visit:
            self._release()
            await run.stop()
            run.lend(-1)

    def resume(self) -> None:
        """The visiting call is over: the collector may go on (while its consumer waits)."""
        if self._run is not None:
            self._run.lend(-1)

    def yield_now(self, *, closing: bool) -> None:
        """Stop at once (``closing``: the pool closes; a later ``__anext__`` says so)."""
        run = self._run
        if run is None or run.finished:
            self._release()
            return
        if not closing and run.consumers:
            raise EnvBusyError(0, _IN_USE)
        if closing:
            run.fail(PoolClosedError("the pool this collector ran on was closed"))
        self._stop_now()

    # -- sync iteration --------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        shim = self._shim
        if shim is None:
            raise TypeError(
                "iterate a collector over an AsyncEnvPool with `async for`; `for` needs a SerialEnv or ParallelEnv"
            )
        return self._iterate(shim)

    def _iterate(self, shim: BatchedEnv) -> Iterator[T]:
        try:
            while True:
                try:
                    yield shim.loop_driver.run(self.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if not shim.is_closed:
                shim.loop_driver.run(self.aclose)

    def close(self) -> None:
        """Stop, from synchronous code (a collector over a SerialEnv / ParallelEnv)."""
        if self._shim is not None and self._run is not None and not self._shim.is_closed:
            self._shim.loop_driver.run(self.aclose)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_IN_USE = (
    "a collector (aenvs.collect) holds this pool and a task is waiting for its next item: a "
    "pool runs one collection at a time, and its envs are the collector's until it stops. "
    "Stop it first (break out of its loop, `await collector.aclose()`, or cancel the task "
    "iterating it); get_attr, call and set_attr may run beside it"
)


def _check_arguments(**values: int | float | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if name == "max_wait":
            if value < 0:
                raise ValueError(f"max_wait must be >= 0, got {value}")
        elif not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")

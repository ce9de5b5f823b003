"""``aenvs.collect``: a streaming collector over a pool, iterated with ``async for`` or ``for``."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, Literal, Self, TypeVar, cast, overload

from aenvs._collect.driver import Driver, Settings
from aenvs._collect.outputs import Episode, FrameBatch
from aenvs._collect.plan import EpisodePlan, Tasks
from aenvs._collect.policy import Policy
from aenvs._env import EnvState
from aenvs._pool import AsyncEnvPool
from aenvs._sync import BatchedEnv

__all__ = ["Collector", "collect"]

Collected = Episode | FrameBatch
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
            holding ``"action"`` (and anything else to keep, such as log-probs), or returns the
            actions one per row (text, numbers, tensors). An ``async def`` policy (an inference
            server's client) is awaited, so policy calls overlap the envs' steps.
        frames_per_batch: yield :class:`FrameBatch` es of this many transitions (TorchRL's
            collectors' batches), in the order they completed.
        episodes: yield each finished :class:`Episode` (default: when ``frames_per_batch`` is
            not given). Both may be on: episodes and frame batches come in one stream.
        max_batch: at most this many envs per policy call.
        max_wait: once a slot is free and an env is ready, wait up to this many seconds for
            the batch to fill to ``max_batch`` (RLlib's ``remote_env_batch_wait_ms``).
        max_policy_calls: policy calls in flight at once.
        tasks: reset options per episode: ``tasks(env_index, episode_number_of_that_env)``,
            or an iterable of them taken as episodes start (a dataset of prompts; the
            collection ends when it is exhausted and the episodes running have finished).
        total_episodes: episodes to run in all, then end.
        episodes_per_env: episodes to run per env, then end.
        total_frames: end after yielding this many transitions in frame batches.
        on_env_error: ``"raise"`` (an env's error ends the collection with that EnvError) or
            ``"skip"`` (its episode is dropped, its task handed out again, up to three
            episodes in all, then listed in :attr:`Collector.failed_tasks`; the env is reset
            for a new one, and an env whose reset fails gets no more episodes).

    Breaking out of the loop, cancelling it or calling :meth:`Collector.aclose` stops the
    collection: what was yielded is yours, the steps still in flight are abandoned (the pool
    drops their results when they arrive, see :meth:`AsyncEnvPool.abandon`) and the pool is
    usable at once (its whole-batch calls wait for those results first).

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

    Attributes:
        steps: env steps recorded so far.
        episodes_started: episodes started so far.
        failed_tasks: tasks given up (``on_env_error="skip"``).

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
        self._shim = pool if isinstance(pool, BatchedEnv) else None
        self._pool: AsyncEnvPool = pool.pool if isinstance(pool, BatchedEnv) else pool
        self._policy = policy
        self._settings = Settings(
            max_batch, max_wait, max_policy_calls, frames_per_batch, episodes, total_frames, on_env_error
        )
        self._tasks = tasks
        self._budgets = (total_episodes, episodes_per_env)
        self._driver: Driver | None = None
        self._run: _Run | None = None

    @property
    def steps(self) -> int:
        return 0 if self._driver is None else self._driver.steps

    @property
    def episodes_started(self) -> int:
        return 0 if self._driver is None else self._driver.plan.started

    @property
    def failed_tasks(self) -> list[Any]:
        """With ``on_env_error="skip"``: the tasks given up, after failing three episodes or
        with no env left to run them (every env's reset failed)."""
        return [] if self._driver is None else list(self._driver.plan.failed)

    # -- async iteration -------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        run = self._run
        if run is None:
            run = self._run = self._start()
        try:
            return cast(T, await run.next())
        except asyncio.CancelledError:
            self._stop_now()  # a cancelled consumer stops the collection: the pool is usable at once
            raise

    def _start(self) -> _Run:
        pool = self._pool
        if pool.batch_size[1:]:
            raise ValueError(
                f"the collector steps envs one by one; this pool's envs have a batch size of their own "
                f"({list(pool.batch_size[1:])})"
            )
        busy = [i for i, s in enumerate(pool.env_states) if s is EnvState.ERROR]
        if busy and self._settings.on_env_error == "raise":
            raise ValueError(f"envs {busy} are in ERROR; reset them or use on_env_error='skip'")
        total_episodes, episodes_per_env = self._budgets
        plan = EpisodePlan(
            pool.num_envs, tasks=self._tasks, total_episodes=total_episodes, episodes_per_env=episodes_per_env
        )
        # items handed out but not taken yet: past this many, the envs wait for the consumer
        backlog = 4 if self._settings.frames_per_batch is not None else 2 * pool.num_envs
        run = _Run(backlog)
        self._driver = Driver(pool, self._policy, self._settings, plan, run.put, run.room)
        run.start(self._driver.run())
        return run

    async def aclose(self) -> None:
        """Stop: policy calls cancelled, steps in flight abandoned; the pool usable. Idempotent."""
        run = self._run
        if run is not None:
            await run.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # dropped mid-iteration (a `break` out of `async for`): stop sending now, so the pool is
        # usable by the caller's next line; the driver task finishes its cancellation after
        if getattr(self, "_run", None) is not None:
            self._stop_now()

    def _stop_now(self) -> None:
        driver, run = self._driver, self._run
        if driver is not None and run is not None and run.task is not None and not run.task.done():
            driver.stop_now()
            run.cancel()

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
            shim.loop_driver.run(self.aclose)

    def close(self) -> None:
        """Stop, from synchronous code (a collector over a SerialEnv / ParallelEnv)."""
        if self._shim is not None and self._run is not None:
            self._shim.loop_driver.run(self.aclose)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Run:
    """The running driver task and the items it handed out, not yet taken."""

    def __init__(self, backlog: int) -> None:
        self.items: deque[Collected] = deque()
        self.task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._backlog = backlog
        self._taken: asyncio.Event | None = None  # set when the consumer takes an item
        self._turns = 0

    async def room(self) -> None:
        """Let the consumer run (when it has items to take, and every few batches: a driver
        whose envs and policy never suspend must not hold the loop); wait for it while it
        has ``backlog`` items not taken."""
        self._turns += 1
        if self.items or not self._turns & 7:
            await asyncio.sleep(0)
        while len(self.items) >= self._backlog:
            if self._taken is None:
                self._taken = asyncio.Event()
            await self._taken.wait()

    def start(self, driving: Any) -> None:
        self.task = asyncio.get_running_loop().create_task(driving)
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here, raised by next(): no "never retrieved" warning
        self._wake()

    def put(self, item: Collected) -> None:
        self.items.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> Collected:
        task = self.task
        assert task is not None
        while not self.items:
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # pyright: ignore[reportGeneralTypeIssues]
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        taken, self._taken = self._taken, None
        if taken is not None:
            taken.set()
        return self.items.popleft()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def stop(self) -> None:
        task = self.task
        if task is None:
            return
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            task.exception()  # retrieved: raised by next(), not by stopping


def _check_arguments(**values: int | float | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if name == "max_wait":
            if value < 0:
                raise ValueError(f"max_wait must be >= 0, got {value}")
        elif not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")

"""The collector's loop: envs that are ready, batched for the policy, stepped as soon as it answers.

``max_policy_calls`` slots each run: take every env ready now (at most ``max_batch``; with
``max_wait``, wait that long for the batch to fill), call the policy on them, send their
actions. A slot takes a batch only when it is free, so while the policy is busy results
accumulate and the next batch is as large as the envs allow: the continuous batching of an
inference server. Results are harvested from the pool (steps and resets alike), recorded as
references to rows of the batches they came in, and handed out as episodes and frame
batches when complete.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs._collect.columns import Columns, build_rows
from aenvs._collect.outputs import Episode, FrameBatch
from aenvs._collect.plan import EpisodePlan
from aenvs._collect.policy import Policy, call_policy
from aenvs._errors import EnvError
from aenvs._pool import AsyncEnvPool
from aenvs._tensors import non_tensor_rows, non_tensor_stack, td_get

__all__ = ["Driver", "Settings"]

_FLAGS = frozenset({"reward", "done", "terminated", "truncated", "timed_out", "env_index"})


@dataclass(frozen=True)
class Settings:
    """How a collector batches and what it hands out (see :func:`aenvs.collect`)."""

    max_batch: int | None
    max_wait: float | None
    max_policy_calls: int
    frames_per_batch: int | None
    episodes: bool
    total_frames: int | None
    on_env_error: str


class _EpisodeState:
    __slots__ = ("id", "record", "task")

    def __init__(self, episode_id: int, task: Mapping[str, Any] | None) -> None:
        self.id = episode_id
        self.task = task
        self.record: list[Any] = []  # four items a transition (see Transitions)


async def _yield() -> None:
    await asyncio.sleep(0)


class Driver:
    """Runs ``pool``'s envs under ``policy`` and hands what completes to ``emit``.

    Args:
        pool: a started pool whose envs have nothing in flight.
        policy: see :data:`aenvs._collect.policy.Policy`.
        settings: batching and outputs.
        plan: the episodes to run.
        emit: called with each :class:`Episode` and :class:`FrameBatch`, in order.
        room: awaited before each policy batch: returns once what was emitted may grow (the
            consumer keeps up); it must let the loop run (default: one turn of the loop).

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> async def main():
        ...     out = []
        ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
        ...         plan = EpisodePlan(2, tasks=None, total_episodes=3, episodes_per_env=None)
        ...         settings = Settings(None, None, 1, None, True, None, "raise")
        ...         await Driver(pool, lambda td: [0] * td.batch_size[0], settings, plan, out.append).run()
        ...     return [type(e).__name__ for e in out]
        >>> asyncio.run(main())
        ['Episode', 'Episode', 'Episode']
    """

    def __init__(
        self,
        pool: AsyncEnvPool,
        policy: Policy,
        settings: Settings,
        plan: EpisodePlan,
        emit: Callable[[Episode | FrameBatch], None],
        room: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        n = pool.num_envs
        self.pool = pool
        self.policy = policy
        self.settings = settings
        self.plan = plan
        self.emit = emit
        self.room = room or _yield
        self.episodes: list[_EpisodeState | None] = [None] * n
        # per env: the batch and row of what its next action answers, and of the policy's
        # answer for its step in flight (parallel lists: nothing allocated per step)
        self.observed: list[Columns | None] = [None] * n
        self.observed_row = [0] * n
        self.acted: list[Columns | None] = [None] * n
        self.acted_row = [0] * n
        self.waiting: deque[int] = deque()  # envs ready for the policy, in order of readiness
        self.steps_in_flight = 0
        self.resets_in_flight = 0
        self.policy_calls = 0
        self.frames: list[Any] = []  # four items a transition
        self.frames_out = 0
        self.batches_out = 0
        self.next_episode_id = 0
        self.done = False
        self.steps = 0
        self.episodes_out = 0
        self._changed: asyncio.Event | None = None
        self._harvesting = False
        self._action_keys = sorted(
            {leaf.key for spec in pool.env_specs for leaf in spec.action_leaves}, key=lambda k: k
        )

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Start every env's first episode, run until the budgets are spent, then stop."""
        if self.pool.has_abandoned:
            await self.pool.drop_abandoned()
        await self._start_episodes(range(self.pool.num_envs))
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(self.settings.max_policy_calls):
                    group.create_task(self._slot())
        except BaseExceptionGroup as failed:  # a slot's error (the policy's, an env's) as it was
            raise failed.exceptions[0] from None
        finally:
            if (self.steps_in_flight or self.resets_in_flight) and not self.pool.is_closed:
                self.pool.abandon()
                self.steps_in_flight = self.resets_in_flight = 0
        self.plan.close()
        self._flush_frames(final=True)

    async def _slot(self) -> None:
        while True:
            await self.room()  # the consumer runs, and holds the envs back when it lags
            envs = await self._take_batch()
            if envs is None:
                return
            self.policy_calls += 1
            try:
                out = await self._act(envs)
            finally:
                self.policy_calls -= 1
            if self.done:
                return
            await self.pool.async_step_send_columns(envs, out)
            self.steps_in_flight += len(envs)
            if self.done:  # stopped while sending
                self.pool.abandon(envs)
            self._notify()

    async def _act(self, envs: list[int]) -> dict[tuple[str, ...], Any]:
        """The policy's answer for ``envs``, recorded; the actions to send, by key."""
        observed = [self.observed[i] for i in envs]
        if any(cols is None for cols in observed):
            raise RuntimeError(f"envs {envs} were batched for the policy without an observation")
        episodes = self.episodes
        ids = [e.id if e is not None else -1 for e in map(episodes.__getitem__, envs)]
        td = build_rows(
            cast("list[Columns]", observed),
            [self.observed_row[i] for i in envs],
            exclude=_FLAGS,
            common=True,
            extra={"env_index": torch.tensor(envs, dtype=torch.int64), "episode": torch.tensor(ids)},
        )
        out, returned = await call_policy(self.policy, td)
        columns = Columns(out)
        actions: dict[tuple[str, ...], Any] = {}
        if returned is not None:  # the actions as the policy gave them: no object per text action
            actions[("action",)] = returned
            if columns.leaves is None:
                out.set(
                    "action", returned if isinstance(returned, torch.Tensor) else non_tensor_stack(returned)
                )  # pyright: ignore[reportUnknownMemberType]
                columns = Columns(out)
            else:
                columns.leaves[("action",)] = (
                    returned.numpy() if isinstance(returned, torch.Tensor) else returned
                )
        else:
            for key in self._action_keys:
                value = td_get(out, key)
                if value is None:
                    raise KeyError(f"the policy's answer has no {'.'.join(key)!r} entry for envs {envs}")
                actions[key] = value if isinstance(value, torch.Tensor) else non_tensor_rows(value, len(envs))
        acted, acted_row, observed_now = self.acted, self.acted_row, self.observed
        for b, i in enumerate(envs):
            acted[i] = columns
            acted_row[i] = b
            observed_now[i] = None
        return actions

    async def _take_batch(self) -> list[int] | None:
        """The next envs for the policy, or None when the collection is over."""
        settings = self.settings
        limit = settings.max_batch
        while True:
            if self.done:
                return None
            if self.waiting:
                if settings.max_wait is not None and (limit is None or len(self.waiting) < limit):
                    await self._fill(settings.max_wait, limit)
                    if self.done:
                        return None
                take = len(self.waiting) if limit is None else min(limit, len(self.waiting))
                return [self.waiting.popleft() for _ in range(take)]
            if (self.steps_in_flight or self.resets_in_flight) and not self._harvesting:
                # one slot waits on the pool at a time: the others wait for it (or for a send),
                # so none is left waiting on results another slot has taken
                self._harvesting = True
                try:
                    await self.pool.wait_ready()
                    await self._harvest()
                finally:
                    self._harvesting = False
                    self._notify()
            elif self.policy_calls or self._harvesting:
                await self._wait_changed()  # another slot's envs will be sent
            else:
                self.done = True
                self._notify()
                return None

    async def _fill(self, max_wait: float, limit: int | None) -> None:
        """Wait up to ``max_wait`` for more envs to be ready, until ``limit`` are."""
        deadline = time.monotonic() + max_wait
        while (limit is None or len(self.waiting) < limit) and (
            self.steps_in_flight or self.resets_in_flight
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await self.pool.wait_ready(timeout=remaining)
            except TimeoutError:
                return
            await self._harvest()

    async def _wait_changed(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def stop_now(self) -> None:
        """Stop from synchronous code: nothing more is sent, what is in flight is abandoned."""
        self.done = True
        self._notify()
        if not self.pool.is_closed and (self.steps_in_flight or self.resets_in_flight):
            self.pool.abandon()
            self.steps_in_flight = self.resets_in_flight = 0

    # -- results ---------------------------------------------------------------------------

    async def _harvest(self) -> None:
        """Take every step and reset result ready now and record it."""
        pool = self.pool
        while True:
            try:
                steps = await self._recv_steps() if self.steps_in_flight else None
                resets = await pool.async_reset_recv(min_get=0) if self.resets_in_flight else None
            except EnvError as exc:
                await self._failed(exc)
                continue
            break
        restart: list[int] = []
        if steps is not None and len(steps[0]):
            restart = self._record_steps(*steps)
        if resets is not None and resets.batch_size[0]:
            self._record_resets(resets)
        if restart:
            await self._start_episodes(restart)
        if self.settings.frames_per_batch is not None:
            self._flush_frames(final=False)

    async def _recv_steps(self) -> tuple[list[int], list[bool], Columns]:
        """The step results ready now: their envs, whether each episode ended, their ``"next"``."""
        pool = self.pool
        if pool.is_dense:  # read as columns: no TensorDict, no row object per text entry
            columns = await pool.async_step_recv_columns()
            envs: list[int] = columns.pop(("env_index",)).tolist()
            if not envs:
                return [], [], Columns.of(columns, 0)
            done = columns[("done",)]
            ended = cast("list[bool]", np.asarray(done).reshape(len(envs), -1).any(-1).tolist())
            return envs, ended, Columns.of(columns, len(envs))
        out = await pool.async_step_recv(min_get=0)
        k = out.batch_size[0]
        nxt: TensorDictBase = out["next"]
        return out["env_index"].tolist(), nxt["done"].reshape(k, -1).any(-1).tolist(), Columns(nxt)

    def _record_steps(self, envs: list[int], done: list[bool], columns: Columns) -> list[int]:
        """Record a batch of step results; the envs whose episode ended."""
        k = len(envs)
        self.steps_in_flight -= k
        self.steps += k
        acted, acted_row, episodes, waiting = self.acted, self.acted_row, self.episodes, self.waiting
        observed, observed_row = self.observed, self.observed_row
        frames = self.frames if self.settings.frames_per_batch is not None else None
        keep_episodes = self.settings.episodes
        ended: list[int] = []
        for r, i in enumerate(envs):
            policy_batch = acted[i]
            acted[i] = None
            if frames is not None:
                frames += (policy_batch, acted_row[i], columns, r)
            episode = episodes[i]
            if keep_episodes and episode is not None:
                episode.record += (policy_batch, acted_row[i], columns, r)
            if done[r]:
                ended.append(i)
            else:
                observed[i] = columns
                observed_row[i] = r
                waiting.append(i)
        for i in ended:
            self._end_episode(i)
        return ended

    def _record_resets(self, out: TensorDictBase) -> None:
        k = out.batch_size[0]
        self.resets_in_flight -= k
        columns = Columns(out)
        for r, i in enumerate(out["env_index"].tolist()):
            self.observed[i] = columns
            self.observed_row[i] = r
            self.waiting.append(i)

    def _end_episode(self, i: int) -> None:
        episode = self.episodes[i]
        self.episodes[i] = None
        if episode is None:
            return
        if self.settings.episodes and episode.record:
            self.episodes_out += 1
            self.emit(Episode(episode.record, env_index=i, episode_id=episode.id, task=episode.task))

    async def _start_episodes(self, envs: Sequence[int]) -> None:
        """Reset ``envs`` for their next episode, where the plan has one."""
        plain: list[int] = []
        for i in envs:
            if self.done:
                return
            go, task = self.plan.next(i)
            if not go:
                continue
            self.episodes[i] = _EpisodeState(self.next_episode_id, task)
            self.next_episode_id += 1
            if task is None:
                plain.append(i)
            else:
                await self._reset([i], task)
        if plain:
            await self._reset(plain, None)

    async def _reset(self, envs: list[int], task: Mapping[str, Any] | None) -> None:
        try:
            await self.pool.async_reset_send(env_index=envs, options=task)
        except EnvError as exc:
            if self.settings.on_env_error == "raise":
                raise
            for i in envs:  # retired: no more episodes on these envs
                self._drop_episode(i)
            del exc
            return
        self.resets_in_flight += len(envs)
        if self.done:  # stopped while sending
            self.pool.abandon(envs)

    async def _failed(self, exc: EnvError) -> None:
        """An env failed (its result was an error): raise, or drop its episode and go on."""
        i = exc.env_index
        if self.acted[i] is not None:
            self.acted[i] = None
            self.steps_in_flight -= 1
        else:
            self.resets_in_flight -= 1
        if self.settings.on_env_error == "raise":
            raise exc
        self._drop_episode(i)
        if exc.command == "step" or exc.command == "step_and_reset":
            await self._start_episodes([i])  # a new episode; an env whose reset fails is retired

    def _drop_episode(self, i: int) -> Mapping[str, Any] | None:
        episode = self.episodes[i]
        self.episodes[i] = None
        if episode is None:
            return None
        self.plan.give_back(i, episode.task)
        return episode.task

    # -- frames ----------------------------------------------------------------------------

    def _flush_frames(self, *, final: bool) -> None:
        """Hand out full frame batches (and, at the end, what remains)."""
        size = self.settings.frames_per_batch
        if size is None:
            return
        total = self.settings.total_frames
        while len(self.frames) >= 4 * size or (final and self.frames):
            take = self.frames[: 4 * size]
            del self.frames[: 4 * size]
            self.emit(FrameBatch(take, index=self.batches_out))
            self.batches_out += 1
            self.frames_out += len(take) // 4
            if total is not None and self.frames_out >= total:
                self.frames.clear()
                self.done = True
                self._notify()
                return

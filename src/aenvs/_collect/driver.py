"""The collector's loop: envs that are ready, batched for the policy, stepped as soon as it answers.

``max_policy_calls`` slots each run: take every env ready now (at most ``max_batch``; with
``max_wait``, wait that long for the batch to fill), call the policy on them, send their
actions. A slot takes a batch only when it is free, so while the policy is busy results
accumulate and the next batch is as large as the envs allow: the continuous batching of an
inference server. Results are harvested from the pool (steps and resets alike), recorded as
references to rows of the batches they came in, and handed out as episodes and frame
batches when complete.

Nothing new starts (no policy call, no send, no task taken) while the gate is closed: the
collector opens it only while its consumer waits for an item and no other caller's call
holds the pool. Results keep being received meanwhile, and :meth:`Driver.quiesce`
receives every one still due, so that another caller finds every env free.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs._collect.columns import Columns, build_rows
from aenvs._collect.outputs import Episode, FrameBatch
from aenvs._collect.plan import EpisodePlan, reset_options
from aenvs._collect.policy import Policy, answer_columns, call_policy, describe
from aenvs._errors import EnvError
from aenvs._pool import AsyncEnvPool

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

    def __init__(self, episode_id: int, task: Any) -> None:
        self.id = episode_id
        self.task = task
        self.record: list[Any] = []  # four items a transition (see Transitions)


class Driver:
    """Runs ``pool``'s envs under ``policy`` and hands what completes to ``emit``.

    Args:
        pool: a started pool whose envs have nothing in flight.
        policy: see :data:`aenvs._collect.policy.Policy`.
        settings: batching and outputs.
        plan: the episodes to run.
        emit: called with each :class:`Episode` and :class:`FrameBatch`, in order, and the
            numbers of the tasks whose episodes it hands out (see :meth:`EpisodePlan.ended`).

    The gate (:meth:`open_gate`) starts open: a driver run on its own goes until its budgets
    are spent.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> async def main():
        ...     out = []
        ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
        ...         plan = EpisodePlan(2, tasks=None, total_episodes=3, episodes_per_env=None)
        ...         settings = Settings(None, None, 1, None, True, None, "raise")
        ...         emit = lambda item, numbers: out.append(item)
        ...         await Driver(pool, lambda td: [0] * td.batch_size[0], settings, plan, emit).run()
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
        emit: Callable[[Episode | FrameBatch, list[int]], None],
    ) -> None:
        n = pool.num_envs
        self.pool = pool
        self.policy = policy
        self.settings = settings
        self.plan = plan
        self.emit = emit
        self.episodes: list[_EpisodeState | None] = [None] * n
        # per env: the batch and row of what its next action answers, and of the policy's
        # answer for its step in flight (parallel lists: nothing allocated per step)
        self.observed: list[Columns | None] = [None] * n
        self.observed_row = [0] * n
        self.acted: list[Columns | None] = [None] * n
        self.acted_row = [0] * n
        self.waiting: deque[int] = deque()  # envs ready for the policy, in order of readiness
        self.to_start: deque[int] = deque(range(n))  # envs whose next episode is to start
        self.steps_in_flight = 0
        self.resets_in_flight = 0
        self.sending = 0  # sends under way (not in flight yet)
        self.held = 0  # slots holding envs taken for the policy, or starting episodes
        self.policy_calls = 0
        self.frames: list[Any] = []  # four items a transition
        # frames only: (frames recorded, task number) of the episodes ended, until handed out
        self.frame_ends: list[tuple[int, int]] = []
        self.frames_out = 0
        self.batches_out = 0
        self.next_episode_id = 0
        self.done = False
        self.steps = 0
        self.episodes_out = 0
        self._changed: asyncio.Event | None = None
        self._harvesting = False
        self._gate = asyncio.Event()
        self._gate.set()
        self._turns = 0
        self._action_keys = sorted(
            {leaf.key for spec in pool.env_specs for leaf in spec.action_leaves}, key=lambda k: k
        )

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Start every env's first episode, run until the budgets are spent, then stop."""
        if self.pool.has_abandoned:
            await self.pool.drop_abandoned()
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
            await self.gate()
            if self.done:
                return
            if self.to_start:
                await self._start_pending()
                continue
            envs = await self._take_batch()
            if envs is None:
                return
            if envs:
                await self._act_and_send(envs)

    def open_gate(self, is_open: bool) -> None:
        """Let new work start (policy calls, sends, tasks taken), or hold it back."""
        if is_open or self.done:
            self._gate.set()
        else:
            self._gate.clear()

    async def gate(self) -> None:
        """Return once new work may start (at once when the collection is over); let the loop
        run every few turns (a driver whose envs and policy never suspend must not hold it)."""
        self._turns += 1
        if not self._turns & 7:
            await asyncio.sleep(0)
        if not self._gate.is_set():
            await self._gate.wait()

    def _end(self) -> None:
        """The collection is over: every slot returns at its next look."""
        self.done = True
        self._gate.set()
        self._notify()

    async def _act_and_send(self, envs: list[int]) -> None:
        """Call the policy on ``envs`` and send their actions, each once the gate lets it."""
        self.held += 1
        try:
            await self.gate()
            if self.done:
                return
            self.policy_calls += 1
            try:
                out, returned = await self._act(envs)
            finally:
                self.policy_calls -= 1
            await self.gate()
            if self.done:
                return
            self.sending += 1
            try:
                await self.pool.async_step_send_columns(envs, out)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{exc} (the policy's answer for envs {envs}: {describe(returned)})") from exc
            finally:
                self.sending -= 1
            self.steps_in_flight += len(envs)
            if self.done:  # stopped while sending
                self.pool.abandon(envs)
        finally:
            self.held -= 1
            self._notify()

    async def _act(self, envs: list[int]) -> tuple[dict[tuple[str, ...], Any], Any]:
        """The policy's answer for ``envs``, recorded; the actions to send, by key, and what
        the policy returned (for errors)."""
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
        out, returned = await call_policy(self.policy, td, envs)
        columns, actions = answer_columns(out, returned, self._action_keys, envs)
        acted, acted_row, observed_now = self.acted, self.acted_row, self.observed
        for b, i in enumerate(envs):
            acted[i] = columns
            acted_row[i] = b
            observed_now[i] = None
        return actions, returned if returned is not None else out

    async def _take_batch(self) -> list[int] | None:
        """The next envs for the policy, or None when the collection is over ([]: episodes
        are to start first)."""
        settings = self.settings
        limit = settings.max_batch
        while True:
            if self.done:
                return None
            if self.to_start:
                return []
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
            elif self.held or self.sending or self._harvesting:
                await self._wait_changed()  # another slot's envs will be sent
            else:
                self._end()
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
                if self._harvesting:  # one waits on the pool at a time: wait for what it records
                    await asyncio.wait_for(self._wait_changed(), remaining)
                    continue
                self._harvesting = True
                try:
                    await self.pool.wait_ready(timeout=remaining)
                    await self._harvest()
                finally:
                    self._harvesting = False
                    self._notify()
            except TimeoutError:
                return

    async def quiesce(self) -> None:
        """Receive (and record) every result of what was sent; with the gate closed, the envs
        are then free for another caller. A sending slot is waited for; an env's error (with
        ``on_env_error="raise"``) ends the collection: raised, what else is due abandoned
        and dropped."""
        try:
            while self.steps_in_flight or self.resets_in_flight or self.sending:
                if self._harvesting or not (self.steps_in_flight or self.resets_in_flight):
                    await self._wait_changed()  # another waits on the pool, or a send ends
                    continue
                self._harvesting = True
                try:
                    await self.pool.wait_ready()
                    await self._harvest()
                finally:
                    self._harvesting = False
                    self._notify()
        except EnvError:
            self.stop_now()
            if not self.pool.is_closed:
                await self.pool.drop_abandoned()
            raise

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
        self._end()
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
        if steps is not None and len(steps[0]):
            self.to_start.extend(self._record_steps(*steps))
        if resets is not None and resets.batch_size[0]:
            self._record_resets(resets)
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
        number = self.plan.ended(i)
        if self.settings.episodes:
            if episode.record:
                self.episodes_out += 1
                episode_out = Episode(episode.record, env_index=i, episode_id=episode.id, task=episode.task)
                self.emit(episode_out, [number])
        else:  # its task is done once the frame batch holding its last transition is handed out
            self.frame_ends.append((len(self.frames), number))

    async def _start_pending(self) -> None:
        """Reset the envs waiting for their next episode, where the plan has one; an env's
        task is taken as its reset goes out (each in turn, as the gate lets it)."""
        self.held += 1
        try:
            plain: list[int] = []
            while self.to_start and not self.done:
                await self.gate()
                if self.done or not self.to_start:  # another slot took the last ones
                    break
                i = self.to_start.popleft()
                go, task = self.plan.next(i)
                if not go:
                    continue
                self.episodes[i] = _EpisodeState(self.next_episode_id, task)
                self.next_episode_id += 1
                if task is None:
                    plain.append(i)  # one reset for all of them
                else:
                    await self._reset([i], task)
            if plain and not self.done:
                await self._reset(plain, None)
        finally:
            self.held -= 1
            self._notify()

    async def _reset(self, envs: list[int], task: Any) -> None:
        self.sending += 1
        try:
            await self.pool.async_reset_send(env_index=envs, options=reset_options(task))
        except EnvError as exc:
            if self.settings.on_env_error == "raise":
                raise
            for i in envs:  # retired: no more episodes on these envs
                self._drop_episode(i)
            del exc
            return
        finally:
            self.sending -= 1
            self._notify()  # a quiesce may wait for this send (it runs once this task yields)
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
            self.to_start.append(i)  # a new episode; an env whose reset fails is retired

    def _drop_episode(self, i: int) -> None:
        episode = self.episodes[i]
        self.episodes[i] = None
        if episode is not None:
            self.plan.give_back(i, episode.task)

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
            ends, numbers = self.frame_ends, list[int]()  # the episodes whose last transition goes out now
            while ends and ends[0][0] <= len(take):
                numbers.append(ends.pop(0)[1])
            self.frame_ends = [(at - len(take), number) for at, number in ends]
            self.emit(FrameBatch(take, index=self.batches_out), numbers)
            self.batches_out += 1
            self.frames_out += len(take) // 4
            if total is not None and self.frames_out >= total:
                self.frames.clear()
                self._end()
                return

"""Episode deadlines (``episode_timeout``), and timeouts that end an episode as truncated
(``on_timeout="truncate"``) instead of raising.

An env's episode may last ``episode_timeout`` seconds from the moment the pool received
its reset result. A step in flight when that deadline passes is stopped as ``step_timeout``
stops one (the executor's ``abort``); a step sent after it is not dispatched at all, its
outcome ready at once. Either way the outcome is an EnvTimeoutError for the env, or with
``on_timeout="truncate"`` (which applies to ``step_timeout`` too) a normal result: done and
truncated, not terminated, reward 0, ``("next", "timed_out")`` True, and under ``"next"``
the env's last observation, the one the step started from. An env whose step was stopped
lost its worker's state: it is rebuilt (a free restart, see :mod:`aenvs._pool.restarts`)
and needs a reset, as after any episode end. A step-and-reset resets it too, after the
rebuild, so that its ``next_td`` holds the new episode's first observation.

Non-tensor entries (text observations...) of that last observation are the ones the env
gave with it, kept per env as results arrive (a reference, no copy); its ``"info"`` is
left out: it described a transition, not the observation.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from aenvs._batching import TimedOutStep
from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._pool.failures import Failures
from aenvs._pool.restarts import RestartSupervisor
from aenvs._pool.slots import SlotTable
from aenvs._specs import Key
from aenvs.executors import Executor

__all__ = ["Deadlines", "OnTimeout", "check_on_timeout"]

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET
_FLAG_VALUES = {"reward": 0, "done": True, "truncated": True, "terminated": False}
_SLACK = 0.005  # seconds a timer may fire early (uvloop's clock counts milliseconds)

OnTimeout = Literal["raise", "truncate"]


def check_on_timeout(on_timeout: object) -> None:
    """Raise ValueError unless ``on_timeout`` is ``"raise"`` or ``"truncate"``.

    Example:
        >>> check_on_timeout("cut")
        Traceback (most recent call last):
        ...
        ValueError: on_timeout must be 'raise' or 'truncate', got 'cut'
    """
    if on_timeout not in ("raise", "truncate"):
        raise ValueError(f"on_timeout must be 'raise' or 'truncate', got {on_timeout!r}")


class Deadlines:
    """Per env: when its episode began; and what a timeout becomes under ``on_timeout``.

    Args:
        executor: the pool's executor (its buffers hold the last observations).
        slots: the pool's slot table.
        failures: the pool's failures (timeouts counted and named there).
        restarts: the pool's restart supervisor (envs whose step was stopped are rebuilt).
        episode_timeout: seconds an episode may last, or None.
        truncate: end the episode as truncated instead of raising (``on_timeout="truncate"``).
        reset_timeout: seconds the reset of a step-and-reset that timed out may take, or None.
        drain: records in ``slots`` what arrived.
        closed: whether the pool is closed.

    The pool calls :meth:`arrived` with every batch of completions before recording them,
    and :meth:`submitting` with every command it hands to the executor.

    Example:
        >>> from aenvs.executors import make_executor
        >>> executor, slots = make_executor("inline"), SlotTable(2)
        >>> failures = Failures(executor, num_envs=2, step_timeout=None, reset_timeout=None)
        >>> async def rebuild(indices: list[int]) -> None: ...
        >>> restarts = RestartSupervisor(executor, num_envs=2, max_restarts=0, backoff=0.0,
        ...     is_free=slots.is_free, rebuild_in_place=rebuild, rebuilt=print, broke=print)
        >>> deadlines = Deadlines(executor, slots, failures, restarts, episode_timeout=0.0,
        ...     truncate=False, reset_timeout=None, drain=lambda: None, closed=lambda: False)
        >>> slots.sent(CommandKind.RESET, [0, 1], now=0.0)
        >>> slots.record(deadlines.arrived([Completion(0, CommandKind.RESET)], now=1.0), now=1.0)
        >>> slots.sent(CommandKind.STEP, [0, 1], now=2.0)
        >>> deadlines.submitting(Command(CommandKind.STEP, [0, 1]), 2.0).env_indices  # env 0's is over
        [1]
        >>> type(slots.ready[0].error.to_exception(0, "step")).__name__
        'EnvTimeoutError'
    """

    def __init__(
        self,
        executor: Executor,
        slots: SlotTable,
        failures: Failures,
        restarts: RestartSupervisor,
        *,
        episode_timeout: float | None,
        truncate: bool,
        reset_timeout: float | None,
        drain: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        n = slots.num_envs
        self.episode_timeout = episode_timeout
        self.truncate = truncate
        self._executor = executor
        self._slots = slots
        self._failures = failures
        self._restarts = restarts
        self._reset_timeout = reset_timeout
        self._drain = drain
        self._closed = closed
        self._started = [math.inf] * n  # when each env's episode began (inf: none yet)
        # where each env's last observation is: its reset rows (after a reset, or a
        # step-and-reset, whose reset rows hold the next observation) or its step rows
        self._in_reset_rows = [True] * n
        self._last_extras: list[dict[Key, Any] | None] = [None] * n  # ... and its non-tensor entries
        self._kept: dict[int, TimedOutStep] = {}  # envs being stopped: their last observation
        self._resetting: dict[int, Completion] = {}  # step-and-resets that timed out, awaiting their reset
        if truncate:
            failures.on_expired = self._keep

    # -- results arriving ----------------------------------------------------------------

    def arrived(self, completions: list[Completion], now: float) -> list[Completion]:
        """``completions`` as the pool records them: episode starts and last observations
        noted, steps stopped by a timeout made truncated results (step-and-resets held
        until their reset is done)."""
        if self._failures.stopping:  # an answer may have beaten the stop of its command
            self._failures.screen(completions)
        out: list[Completion] = []
        started, in_reset_rows, last_extras = self._started, self._in_reset_rows, self._last_extras
        resetting = self._resetting
        for c in completions:
            i, kind = c.env_index, c.kind
            if kind is _RESET and i in resetting:  # the reset part of a step-and-reset that timed out
                out.append(self._reset_done(resetting.pop(i), c, now))
                continue
            if c.error is None:
                if kind is _STEP:
                    in_reset_rows[i] = False
                    last_extras[i] = c.extras
                elif kind is _SMR:
                    in_reset_rows[i] = True
                    last_extras[i] = c.reset_extras
                    if c.was_reset:
                        started[i] = now
                elif kind is _RESET:
                    in_reset_rows[i] = True
                    last_extras[i] = c.extras
                    started[i] = now
            elif (
                self.truncate
                and (kind is _STEP or kind is _SMR)
                and c.error.crashed
                and self._failures.take_timeout(i)
            ):
                ended = self._stopped(c, now)
                if ended is None:  # a step-and-reset: delivered with its reset
                    continue
                c = ended
            out.append(c)
        return out

    def _stopped(self, c: Completion, now: float) -> Completion | None:
        """A step stopped by a timeout, as a truncated result; the env is rebuilt. None for a
        step-and-reset, whose result waits for the reset that follows the rebuild."""
        i = c.env_index
        ended = Completion(
            i, c.kind, extras=self._observation_extras(i), done=True, value=self._kept.pop(i, None)
        )
        if ended.value is None:  # stopped without a snapshot: take what the rows hold now
            ended.value = self._last_step(i)
        if c.kind is _STEP:
            self._restarts.failed(i, free=True)
            return ended
        self._resetting[i] = ended
        self._slots.sent_at[i] = now  # the step's own timers, still armed, no longer see it as stuck
        self._restarts.failed(i, free=True, then=lambda rebuilt: self._rebuilt(i, rebuilt))
        return None

    def _rebuilt(self, i: int, rebuilt: bool) -> None:
        """The env of a step-and-reset that timed out was rebuilt (or could not be): reset it."""
        if i not in self._resetting or self._closed():
            return
        if rebuilt:
            self._send_reset([i])
            return
        del self._resetting[i]
        error = RemoteError.worker_died(
            f"env {i} could not be rebuilt after its step_and_maybe_reset timed out (max_restarts)"
        )
        self._deliver([Completion(i, _SMR, error=error)], time.perf_counter())

    def _reset_done(self, ended: Completion, c: Completion, now: float) -> Completion:
        """A step-and-reset that timed out, complete with its reset (or that reset's failure)."""
        i = c.env_index
        if c.error is not None:
            return Completion(i, _SMR, error=c.error)
        ended.reset_extras = c.extras
        ended.was_reset = True
        self._started[i] = now
        self._in_reset_rows[i] = True
        self._last_extras[i] = c.extras
        return ended

    # -- sending ---------------------------------------------------------------------------

    def submitting(self, command: Command, sent_at: float) -> Command | None:
        """``command``, sent at ``sent_at`` (in the slot table already), about to go to the
        executor: a step or step-and-reset goes to the envs whose episode is not over, with a
        timer for their deadlines; the others get their outcome now, without it. None: it
        goes to no env."""
        kind = command.kind
        limit = self.episode_timeout
        if limit is None or (kind is not _STEP and kind is not _SMR):
            return command
        now = time.perf_counter()
        started = self._started
        late = [i for i in command.env_indices if now - started[i] >= limit]
        if late:
            self._end_unsent(kind, late, limit, now)
            live = [i for i in command.env_indices if i not in late]
            if not live:
                return None
            command = command.subset(live)
        first = min(started[i] for i in command.env_indices)
        if first < math.inf:
            loop = asyncio.get_running_loop()
            loop.call_later(first + limit - now, self._episode_over, command.env_indices, sent_at)
        return command

    def _end_unsent(self, kind: CommandKind, late: list[int], limit: float, now: float) -> None:
        """Steps (of ``kind``) to ``late`` sent after their episode deadline: their outcome."""
        counts = self._failures.counts
        for i in late:
            counts[i] += 1
        if not self.truncate:
            self._deliver(
                [
                    Completion(
                        i,
                        kind,
                        error=RemoteError.timed_out(
                            f"env {i}'s episode outlived episode_timeout={limit} s before this "
                            f"{kind.value} was sent; it was not run (reset the env)"
                        ),
                    )
                    for i in late
                ],
                now,
            )
        elif kind is _STEP:
            self._deliver([self._ended(i, kind) for i in late], now)
        else:  # the reset part runs: next_td gets the new episode's first observation
            for i in late:
                self._resetting[i] = self._ended(i, kind)
            self._send_reset(late)

    def _episode_over(self, indices: list[int], sent_at: float) -> None:
        """An episode deadline passed: stop the steps still running past theirs; wait for the rest."""
        if self._closed():
            return
        self._drain()  # what already arrived is not late
        stuck = self._slots.stuck(indices, sent_at)
        if not stuck:
            return
        limit = self.episode_timeout
        assert limit is not None
        now = time.perf_counter()
        started = self._started
        due = [i for i in stuck if started[i] + limit <= now + _SLACK]
        if due:
            self._stop(due, limit, "episode_timeout")
        rest = [i for i in stuck if started[i] + limit > now + _SLACK]
        if rest:
            delay = min(started[i] for i in rest) + limit - now
            asyncio.get_running_loop().call_later(delay, self._episode_over, rest, sent_at)

    def _send_reset(self, indices: list[int]) -> None:
        """Dispatch the reset part of step-and-resets that timed out (their slots stay busy)."""
        now = time.perf_counter()
        sent_at = self._slots.sent_at
        for i in indices:
            sent_at[i] = now
        self._executor.submit(Command(_RESET, indices))
        limit = self._reset_timeout
        if limit is not None:
            asyncio.get_running_loop().call_later(limit, self._reset_over, indices, now, limit)

    def _reset_over(self, indices: list[int], sent_at: float, limit: float) -> None:
        if self._closed():
            return
        self._drain()
        stuck = [i for i in self._slots.stuck(indices, sent_at) if i in self._resetting]
        if stuck:
            self._stop(stuck, limit, None)

    def _stop(self, indices: list[int], limit: float, option: str | None) -> None:
        """Stop the commands of ``indices`` (their completions come back as crashes)."""
        self._failures.expired(indices, limit, option)
        self._executor.abort(indices)

    # -- the truncated results ---------------------------------------------------------------

    def _ended(self, i: int, kind: CommandKind) -> Completion:
        """Env ``i``'s step (of ``kind``), ended by its episode deadline before it was sent."""
        return Completion(i, kind, extras=self._observation_extras(i), done=True, value=self._last_step(i))

    def _deliver(self, completions: list[Completion], now: float) -> None:
        """Make outcomes no worker sent ready, and wake the receives waiting for them."""
        self._slots.record(completions, now)
        self._executor.wake()

    def _keep(self, stuck: Sequence[int]) -> None:
        """Before stopping the steps of ``stuck``: keep their envs' last observations."""
        pending = self._slots.pending
        for i in stuck:
            if (pending[i] is _STEP or pending[i] is _SMR) and i not in self._resetting:
                self._kept[i] = self._last_step(i)

    def _observation_extras(self, i: int) -> dict[Key, Any] | None:
        extras = self._last_extras[i]
        if not extras:
            return None
        return {key: value for key, value in extras.items() if key[0] != "info"} or None

    def _last_step(self, i: int) -> TimedOutStep:
        """Env ``i``'s last observation as a step result that ended the episode as truncated."""
        buffers = self._executor.buffers
        assert buffers is not None
        rows = buffers.rows(i)
        source = rows.reset if self._in_reset_rows[i] else rows.step
        step: dict[Key, np.ndarray] = {}
        for key, view in rows.step.items():
            flag = _FLAG_VALUES.get(key[-1])
            if flag is not None:
                step[key] = np.full_like(view, flag)
                continue
            held = source.get(key)
            step[key] = held.copy() if held is not None and held.shape == view.shape else np.zeros_like(view)
        return TimedOutStep(step)

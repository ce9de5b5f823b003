"""How the pool names its envs' failures: timeouts, non-finite results, restarts to queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from gymnasium import spaces

from aenvs._batching import TimedOutStep
from aenvs._commands import TRANSITIONS, CommandKind, Completion, RemoteError
from aenvs._specs import EnvSpec, Key, text_contains, text_spaces
from aenvs.executors import Executor

__all__ = ["Failures"]


class Failures:
    """Per env: the timeouts its commands outlived; and what a failed completion becomes.

    Args:
        executor: the pool's executor (its buffers hold the results :meth:`vet` reads).
        num_envs: envs of the pool.
        step_timeout: seconds a step (or step-and-reset) may take, or None.
        reset_timeout: seconds a reset may take, or None.
        restart: called with each env to restart after a failure, or None (no restarts).

    Example:
        >>> from aenvs._commands import CommandKind, Completion, RemoteError
        >>> from aenvs.executors import make_executor
        >>> failures = Failures(make_executor("inline"), num_envs=4, step_timeout=2.0, reset_timeout=None)
        >>> failures.limit(CommandKind.STEP), failures.limit(CommandKind.CALL)
        (2.0, None)
        >>> failures.expired([3], 2.0)
        >>> c = Completion(3, CommandKind.STEP, error=RemoteError.worker_died("killed"))
        >>> failures.on_failure(c)
        >>> c.error.to_exception(3, "step").__class__.__name__, failures.counts[3]
        ('EnvTimeoutError', 1)
        >>> failures.expired([3], 0.5, "episode_timeout")
        >>> c = Completion(3, CommandKind.STEP, error=RemoteError.worker_died("killed"))
        >>> failures.on_failure(c)
        >>> print(c.error.traceback.strip())
        EnvTimeoutError: env 3's episode outlived episode_timeout=0.5 s during its step; its worker was stopped
        >>> failures.expired([3], 2.0)  # the step finished as it was stopped: its result is the stop's
        >>> arrived = [Completion(3, CommandKind.STEP)]
        >>> failures.screen(arrived)
        >>> arrived[0].error.crashed, failures.take_timeout(3)
        (True, True)
    """

    def __init__(
        self,
        executor: Executor,
        *,
        num_envs: int,
        step_timeout: float | None,
        reset_timeout: float | None,
        restart: Callable[[int], None] | None = None,
    ) -> None:
        self.counts = [0] * num_envs  # timeouts per env
        self._executor = executor
        self._limits: dict[CommandKind, float | None] = {
            CommandKind.STEP: step_timeout,
            CommandKind.STEP_AND_RESET: step_timeout,
            CommandKind.RESET: reset_timeout,
        }
        # env -> the timeout its command outlived, until the command's completion arrives
        self.stopping: dict[int, tuple[float, str | None]] = {}
        self._restart = restart
        # called with the envs whose commands are about to be stopped (before their workers
        # are): ``on_timeout="truncate"`` keeps their last observations then
        self.on_expired: Callable[[Sequence[int]], None] | None = None
        # per env, its observation's Text parts by key (set once the envs are built): vet
        # checks their values' length and charset (the runner checks they are str, always)
        self.texts: list[dict[Key, spaces.Text]] = []

    def built(self, specs: Sequence[EnvSpec]) -> None:
        """The envs are built, with these specs."""
        self.texts = [text_spaces(spec.observation_space) for spec in specs]

    def limit(self, kind: CommandKind) -> float | None:
        """Seconds a command of ``kind`` may take (None: no limit)."""
        return self._limits.get(kind)

    def expired(self, stuck: Sequence[int], limit: float, option: str | None = None) -> None:
        """The commands of ``stuck`` outlived ``limit``; their workers are being stopped.

        ``option``: the pool option that set the limit when it is not the command's own
        timeout (``"episode_timeout"``)."""
        if self.on_expired is not None:
            self.on_expired(stuck)
        for i in stuck:
            self.stopping[i] = (limit, option)
            self.counts[i] += 1

    def take_timeout(self, env_index: int) -> bool:
        """Whether ``env_index``'s command was stopped for outliving a timeout (forgotten here:
        its completion is being handled by the caller)."""
        return self.stopping.pop(env_index, None) is not None

    def screen(self, completions: list[Completion]) -> None:
        """Make the stop's crash of every completion in ``completions`` that beat it.

        A command can finish just as its timeout stops its worker: its answer, already on
        its way, arrives instead of the crash the stop gives (the thread executor delivers
        what a worker answered before it was abandoned). Its worker is gone all the same,
        and the env's state with it, so the answer counts as stopped: it becomes that crash,
        which the pool handles as any timeout (an EnvTimeoutError, or a truncated end of
        episode and a rebuild). The pool calls this with each batch of completions that
        arrives while :attr:`stopping` is not empty.
        """
        stopping = self.stopping
        for row, c in enumerate(completions):
            i = c.env_index
            if i in stopping and (c.error is None or not c.error.crashed):
                what = f"env {i}'s {c.kind.value} finished as a timeout stopped its worker"
                completions[row] = Completion(i, c.kind, error=RemoteError.worker_died(what))

    def on_failure(self, c: Completion) -> None:
        """A command failed: name a timeout as such, and queue a restart if the pool does that."""
        i, error = c.env_index, c.error
        assert error is not None
        timed_out = self.stopping.pop(i, None)
        if timed_out is not None and error.crashed:
            limit, option = timed_out
            what = (
                f"env {i} did not finish its {c.kind.value} within {limit} s"
                if option is None
                else f"env {i}'s episode outlived {option}={limit} s during its {c.kind.value}"
            )
            c.error = error = RemoteError.timed_out(f"{what}; its worker was stopped")
        if self._restart is not None and (c.kind in TRANSITIONS or error.crashed):
            self._restart(i)

    def vet(self, c: Completion) -> None:
        """Turn a result holding NaN or inf (in its buffer rows), or a text observation outside
        its ``Text`` space (too long or short, a character outside its charset), into an error
        for its env."""
        buffers = self._executor.buffers
        assert buffers is not None
        rows = buffers.rows(c.env_index)
        if c.kind is CommandKind.RESET:
            parts = [rows.reset]
        elif isinstance(c.value, TimedOutStep):  # a timeout's end of episode: the step did not run
            parts = [rows.reset] if c.was_reset else []
        else:
            parts = [rows.step, rows.reset] if c.was_reset else [rows.step]
        for part in parts:
            for key, view in part.items():
                if view.dtype.kind in "fc" and not np.isfinite(view).all():
                    name = ".".join(key)
                    c.error = RemoteError(
                        "builtins.ValueError",
                        f"ValueError: env {c.env_index} returned NaN or inf in {name!r} (check_finite=True)\n",
                    )
                    return
        texts = self.texts[c.env_index] if self.texts else None
        if texts:
            self._vet_texts(c, texts)

    @staticmethod
    def _vet_texts(c: Completion, texts: dict[Key, spaces.Text]) -> None:
        for extras in (c.extras, c.reset_extras):
            if not extras:
                continue
            for key, space in texts.items():
                value = extras.get(key)
                if isinstance(value, str) and not text_contains(space, value):
                    outside = sorted(set(value) - space.character_set)[:5]
                    c.error = RemoteError(
                        "builtins.ValueError",
                        f"ValueError: env {c.env_index} returned {value[:40]!r} in {'.'.join(key)!r}, "
                        f"not in its space {space}: length {len(value)}"
                        + (f", characters outside its charset {outside}" if outside else "")
                        + " (check_finite=True)\n",
                    )
                    return

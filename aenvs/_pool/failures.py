"""How the pool names its envs' failures: timeouts, non-finite results, restarts to queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from aenvs._commands import TRANSITIONS, CommandKind, Completion, RemoteError
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
        self._timed_out: dict[int, float] = {}  # env -> the timeout its command outlived
        self._restart = restart

    def limit(self, kind: CommandKind) -> float | None:
        """Seconds a command of ``kind`` may take (None: no limit)."""
        return self._limits.get(kind)

    def expired(self, stuck: Sequence[int], limit: float) -> None:
        """The commands of ``stuck`` outlived ``limit``; their workers are being stopped."""
        for i in stuck:
            self._timed_out[i] = limit
            self.counts[i] += 1

    def on_failure(self, c: Completion) -> None:
        """A command failed: name a timeout as such, and queue a restart if the pool does that."""
        i, error = c.env_index, c.error
        assert error is not None
        limit = self._timed_out.pop(i, None)
        if limit is not None and error.crashed:
            c.error = error = RemoteError.timed_out(
                f"env {i} did not finish its {c.kind.value} within {limit} s; its worker was stopped"
            )
        if self._restart is not None and (c.kind in TRANSITIONS or error.crashed):
            self._restart(i)

    def vet(self, c: Completion) -> None:
        """Turn a result holding NaN or inf (in its buffer rows) into an error for its env."""
        buffers = self._executor.buffers
        assert buffers is not None
        rows = buffers.rows(c.env_index)
        if c.kind is CommandKind.RESET:
            parts = [rows.reset]
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

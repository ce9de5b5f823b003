"""The exception tree of aenvs.

```
AenvsError
├── EnvError            an env failed: .env_index, .command, remote traceback text
│   ├── EnvTimeoutError     its command outlived step_timeout / reset_timeout
│   │   └── VectorEnvTimeoutError   AsyncVectorEnv.reset_wait / step_wait outlived its timeout
│   └── EnvCrashedError     the worker (thread, process, actor) hosting it died
├── EnvBusyError        send to an env that already has a command in flight
└── PoolClosedError     any call after close
```

Bad arguments are plain `ValueError` / `TypeError` / `IndexError` that name the
env and the key; cancellation and `KeyboardInterrupt` pass through untouched.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

__all__ = [
    "AenvsError",
    "EnvBusyError",
    "EnvCrashedError",
    "EnvError",
    "EnvTimeoutError",
    "PoolClosedError",
    "VectorEnvTimeoutError",
]


class AenvsError(Exception):
    """Root of every error aenvs raises on its own account."""


class EnvError(AenvsError):
    """An env failed while running a command; the other envs are unaffected.

    Attributes:
        env_index: index of the env in its pool.
        command: the command that failed (``"reset"``, ``"step"``, ``"call:name"``...).
        remote_traceback: the traceback text of the original exception, formatted
            where it was raised (a worker thread, process or actor).
        exc_type: the qualified name of the original exception's type.

    Example:
        >>> from aenvs import EnvError
        >>> err = EnvError(3, "step", "Traceback ...\\nZeroDivisionError: x", "ZeroDivisionError")
        >>> err.env_index, err.command
        (3, 'step')
    """

    def __init__(
        self,
        env_index: int,
        command: str,
        remote_traceback: str = "",
        exc_type: str = "",
        message: str | None = None,
        executor: str = "",
    ) -> None:
        self.env_index = env_index
        self.command = command
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.executor = executor  # set by the pool when the executor did not say
        self._message = message
        super().__init__(env_index, command)

    @property
    def message(self) -> str:
        """The one-line summary: env, command, executor and the original exception's last line."""
        if self._message is not None:
            return self._message
        last = self.remote_traceback.strip().splitlines()[-1] if self.remote_traceback else ""
        where = f" on the {self.executor} executor" if self.executor else ""
        return f"env {self.env_index} failed in {self.command}{where}: {last or self.exc_type}"

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes through pickling (process / ray)
        return (
            type(self),
            (
                self.env_index,
                self.command,
                self.remote_traceback,
                self.exc_type,
                self._message,
                self.executor,
            ),
        )

    def __str__(self) -> str:
        text = self.message
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


class EnvTimeoutError(EnvError):
    """An env's command outlived its ``step_timeout`` / ``reset_timeout``."""


class VectorEnvTimeoutError(EnvTimeoutError, multiprocessing.TimeoutError, TimeoutError):
    """:class:`aenvs.gymnasium.AsyncVectorEnv`'s ``reset_wait`` / ``step_wait`` outlived its ``timeout``.

    What gymnasium's vector envs raise, ``multiprocessing.TimeoutError``, so that code
    catching that keeps working; an :class:`EnvTimeoutError`; and the builtin
    ``TimeoutError``, which the pool raises when a receive times out. Its message starts
    with gymnasium's own. The results stay collectable: calling the ``*_wait`` method
    again carries on.

    Attributes:
        env_index: the first env (lowest index) whose result had not arrived.
        unanswered: every env whose result had not arrived, in order.
        command: ``"reset"`` or ``"step"``; call: ``"reset_wait"`` or ``"step_wait"``.
        timeout: the ``timeout`` the call was given, in seconds.

    Example:
        >>> err = VectorEnvTimeoutError("step_wait", 0.5, [2, 3], 4)
        >>> str(err)
        'The call to `step_wait` has timed out after 0.5 second(s). Envs 2 and 3 of 4 have not answered; the results stay collectable: call `step_wait` again.'
        >>> err.env_index, err.command
        (2, 'step')
    """

    def __init__(self, call: str, timeout: float, unanswered: Sequence[int], num_envs: int) -> None:
        self.call, self.timeout, self.unanswered, self.num_envs = call, timeout, list(unanswered), num_envs
        if not self.unanswered:  # every result arrived between the timeout and this error
            who = "Every env answered just after it"
        elif len(self.unanswered) == 1:
            who = f"Env {self.unanswered[0]} of {num_envs} has not answered"
        else:
            *first, last = self.unanswered
            who = f"Envs {', '.join(map(str, first))} and {last} of {num_envs} have not answered"
        message = (
            f"The call to `{call}` has timed out after {timeout} second(s). {who}; the results stay "
            f"collectable: call `{call}` again."
        )
        super().__init__(
            self.unanswered[0] if self.unanswered else 0, call.removesuffix("_wait"), message=message
        )
        self.errno = self.strerror = (
            None  # the TimeoutError (an OSError) base took the env and command for them
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.call, self.timeout, self.unanswered, self.num_envs))


class EnvCrashedError(EnvError):
    """The worker (thread, process or actor) hosting an env died."""


class EnvBusyError(AenvsError):
    """A command was sent to an env that already has one in flight or a result waiting.

    Example:
        >>> from aenvs import EnvBusyError
        >>> EnvBusyError(2).env_index
        2
    """

    def __init__(self, env_index: int, message: str | None = None) -> None:
        self.env_index = env_index
        super().__init__(
            message
            or f"env {env_index} already has a command in flight or a result not yet "
            "received; recv it before sending again"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.env_index, str(self)))


class PoolClosedError(AenvsError):
    """Any call on a pool after ``aclose()`` / ``close()``."""

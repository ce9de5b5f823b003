"""The exception tree of aenvs.

```
AenvsError
├── EnvError            an env failed: .env_index, .command, remote traceback text
│   ├── EnvTimeoutError     its command outlived step_timeout / reset_timeout
│   └── EnvCrashedError     the worker (thread, process, actor) hosting it died
├── EnvBusyError        send to an env that already has a command in flight
└── PoolClosedError     any call after close
```

Bad arguments are plain `ValueError` / `TypeError` / `IndexError` that name the
env and the key; cancellation and `KeyboardInterrupt` pass through untouched.
"""

from __future__ import annotations

__all__ = [
    "AenvsError",
    "EnvBusyError",
    "EnvCrashedError",
    "EnvError",
    "EnvTimeoutError",
    "PoolClosedError",
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

    def __reduce__(self):  # keep the attributes through pickling (process / ray)
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


class EnvCrashedError(EnvError):
    """The worker (thread, process or actor) hosting an env died."""


class EnvBusyError(AenvsError):
    """A command was sent to an env that already has one in flight or a result waiting.

    Example:
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

    def __reduce__(self):
        return (type(self), (self.env_index, str(self)))


class PoolClosedError(AenvsError):
    """Any call on a pool after ``aclose()`` / ``close()``."""

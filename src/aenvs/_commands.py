"""What the pool sends to executors, and what comes back: plain picklable records."""

from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass
from typing import Any

from aenvs._errors import EnvCrashedError, EnvError, EnvTimeoutError

__all__ = ["TRANSITIONS", "Command", "CommandKind", "Completion", "Packed", "RemoteError", "pack", "unpack"]


class CommandKind(enum.Enum):
    """What a :class:`Command` asks of its envs; the value is the name errors and stats use.

    Example:
        >>> CommandKind.STEP.value, CommandKind.STEP.is_transition
        ('step', True)
    """

    RESET = "reset"
    STEP = "step"
    STEP_AND_RESET = "step_and_maybe_reset"
    SEED = "seed"
    CALL = "call"
    GET_ATTR = "get_attr"
    SET_ATTR = "set_attr"
    REBUILD = "rebuild"  # close the env and build it again from its factory (a restart in place)

    # members are singletons compared by identity: hash them so too, in C (Enum's own
    # __hash__ is a Python call, paid on every dict and set lookup of a kind on the hot path)
    __hash__ = object.__hash__

    @property
    def is_transition(self) -> bool:
        """Whether results of this kind are collected with a ``recv`` (and stacked)."""
        return self in TRANSITIONS


TRANSITIONS = frozenset({CommandKind.RESET, CommandKind.STEP, CommandKind.STEP_AND_RESET})


@dataclass(slots=True)
class Command:
    """One command for a set of envs; an executor splits it by worker.

    ``seeds`` (reset, seed) maps env index to seed; ``name``/``args``/``kwargs``
    describe call, get_attr and set_attr. ``object_actions`` (step) maps env index to its
    non-tensor action values by key: they travel with the command, as the process
    executor's shared memory holds only the fixed-shape rows.
    """

    kind: CommandKind
    env_indices: list[int]
    seeds: dict[int, int | None] | None = None
    options: dict[str, Any] | None = None
    name: str = ""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    object_actions: dict[int, dict[tuple[str, ...], Any]] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # positional and trimmed, as for Completion: most commands are a kind and indices
        fields = (
            self.kind,
            self.env_indices,
            self.seeds,
            self.options,
            self.name,
            self.args,
            self.kwargs,
            self.object_actions,
        )
        end = len(fields)
        while end > 2 and not fields[end - 1]:  # every optional field defaults to an empty value
            end -= 1
        return (Command, fields[:end])

    def is_plain(self) -> bool:
        """Whether the command is its kind and envs only (no seeds, options, call or actions).

        Example:
            >>> Command(CommandKind.STEP, [0, 1]).is_plain(), Command(CommandKind.RESET, [0], {0: 7}).is_plain()
            (True, False)
        """
        return (
            self.seeds is None
            and self.options is None
            and not self.name
            and not self.args
            and self.kwargs is None
            and self.object_actions is None
        )

    def label(self) -> str:
        """The command as errors name it: its kind, and the attribute a call names."""
        return f"{self.kind.value}:{self.name}" if self.name else self.kind.value

    def subset(self, env_indices: list[int]) -> Command:
        """The same command for ``env_indices`` only (their seeds and actions, the same arguments)."""
        seeds = {i: self.seeds[i] for i in env_indices} if self.seeds is not None else None
        objects = self.object_actions
        if objects is not None:
            objects = {i: objects[i] for i in env_indices}
        return Command(
            self.kind, env_indices, seeds, self.options, self.name, self.args, self.kwargs, objects
        )


@dataclass(frozen=True, slots=True)
class RemoteError:
    """An exception captured where it was raised, reduced to what survives any transport.

    ``crashed`` marks the death of the worker hosting the env rather than an env exception.
    """

    exc_type: str
    traceback: str
    crashed: bool = False

    @classmethod
    def capture(cls, exc: BaseException) -> RemoteError:
        """``exc``'s qualified type name and formatted traceback."""
        kind = type(exc)
        return cls(f"{kind.__module__}.{kind.__qualname__}", "".join(traceback.format_exception(exc)))

    @classmethod
    def worker_died(cls, description: str) -> RemoteError:
        """The error of an env whose worker died (an :class:`EnvCrashedError` when raised)."""
        return cls(_CRASHED, f"EnvCrashedError: {description}\n", crashed=True)

    @classmethod
    def timed_out(cls, description: str) -> RemoteError:
        """The error of a command that outlived its timeout (an :class:`EnvTimeoutError`)."""
        return cls(_TIMED_OUT, f"EnvTimeoutError: {description}\n")

    @property
    def interrupted(self) -> bool:
        """Whether this is a KeyboardInterrupt (Ctrl-C) that reached the env's code."""
        return self.exc_type == _INTERRUPTED

    def to_exception(self, env_index: int, command: str, executor: str = "") -> EnvError:
        """The EnvError (EnvCrashedError, EnvTimeoutError) this stands for, raised for ``env_index``."""
        cls = (
            EnvCrashedError if self.crashed else EnvTimeoutError if self.exc_type == _TIMED_OUT else EnvError
        )
        return cls(env_index, command, self.traceback, self.exc_type, executor=executor)


_CRASHED, _TIMED_OUT = "aenvs._errors.EnvCrashedError", "aenvs._errors.EnvTimeoutError"
_INTERRUPTED = f"{KeyboardInterrupt.__module__}.{KeyboardInterrupt.__qualname__}"


@dataclass(slots=True)
class Completion:
    """One env's answer to a command.

    ``extras`` holds the entries that have no fixed-shape buffer (non-tensor data,
    ``("info",)``); ``reset_extras`` the same for the reset half of a step-and-reset.
    ``done`` says the step ended an episode, ``was_reset`` that the worker reset the env.
    """

    env_index: int
    kind: CommandKind
    error: RemoteError | None = None
    extras: dict[tuple[str, ...], Any] | None = None
    reset_extras: dict[tuple[str, ...], Any] | None = None
    done: bool = False
    was_reset: bool = False
    value: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # positional and trimmed: a step's completion crosses a pipe as a handful of bytes
        fields = (
            self.env_index,
            self.kind,
            self.error,
            self.extras,
            self.reset_extras,
            self.done,
            self.was_reset,
            self.value,
        )
        end = len(fields)
        while end > 2 and fields[end - 1] is _COMPLETION_DEFAULTS[end - 1]:
            end -= 1
        return (Completion, fields[:end])


_COMPLETION_DEFAULTS = (None, None, None, None, None, False, False, None)

#: a worker's answer to a command in one piece: (kind, env indices, done flags, was_reset flags)
Packed = tuple[CommandKind, list[int], bytes, bytes]


def pack(completions: list[Completion]) -> list[Completion] | Packed:
    """``completions`` as one small record when they are all plain results of one kind (no
    error, extra entries or value: every step of most envs), else as they are; what a worker
    sends for a command, so that neither side pickles a Completion per env.

    Example:
        >>> done = [Completion(0, CommandKind.STEP, done=True), Completion(1, CommandKind.STEP)]
        >>> unpack(pack(done)) == done
        True
    """
    if not completions:
        return completions
    kind = completions[0].kind
    for c in completions:
        if (
            c.kind is not kind
            or c.error is not None
            or c.extras is not None
            or c.reset_extras is not None
            or c.value is not None
        ):
            return completions
    return (
        kind,
        [c.env_index for c in completions],
        bytes([c.done for c in completions]),
        bytes([c.was_reset for c in completions]),
    )


def unpack(message: list[Completion] | Packed) -> list[Completion]:
    """The completions :func:`pack` made ``message`` of."""
    if isinstance(message, list):
        return message
    kind, indices, done, was_reset = message
    return [
        Completion(i, kind, None, None, None, d == 1, r == 1)
        for i, d, r in zip(indices, done, was_reset, strict=True)
    ]

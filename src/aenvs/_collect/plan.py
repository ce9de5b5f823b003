"""Which episodes a collector runs: their tasks (reset options) and its budgets."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

__all__ = ["EpisodePlan", "Tasks", "check_tasks", "reset_options"]

Tasks = Callable[[int, int], Any] | Iterable[Any]
"""The task of each episode: ``tasks(env_index, episode_number_of_that_env)``, or an
iterable of them taken in order as episodes start (a dataset of prompts). A task is the
episode's reset options (a dict), None (no options), or any other value, passed to the
env as ``options={"task": value}``."""


def check_tasks(tasks: object) -> None:
    """Refuse, naming what was given, a ``tasks`` that is neither a function nor an iterable
    of tasks (a str or a dict iterates over its characters or keys).

    Example:
        >>> check_tasks([{"prompt": "a"}, "b"])
        >>> check_tasks("one prompt")
        Traceback (most recent call last):
        ...
        TypeError: tasks must be an iterable of tasks (one per episode) or a function tasks(env_index, episode_number); got a str ('one prompt'): pass a list, such as ['one prompt']
    """
    if tasks is None or callable(tasks):
        return
    if isinstance(tasks, str | bytes | Mapping):
        given = _short(cast(object, tasks))
        raise TypeError(
            "tasks must be an iterable of tasks (one per episode) or a function tasks(env_index, "
            f"episode_number); got a {type(cast(object, tasks)).__name__} ({given}): pass a list, such as [{given}]"
        )
    if not isinstance(tasks, Iterable):
        raise TypeError(
            "tasks must be an iterable of tasks (one per episode) or a function tasks(env_index, "
            f"episode_number); got {type(tasks).__name__} {_short(tasks)}"
        )


def reset_options(task: Any) -> Mapping[str, Any] | None:
    """The reset options of an episode with ``task``: the task itself when it is a dict (or
    None), else ``{"task": task}`` (a prompt, a question, an id...).

    Example:
        >>> reset_options({"prompt": "hi"}), reset_options("hi"), reset_options(None)
        ({'prompt': 'hi'}, {'task': 'hi'}, None)
    """
    if task is None or isinstance(task, Mapping):
        return task  # pyright: ignore[reportUnknownVariableType]
    return {"task": task}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class EpisodePlan:
    """Hands out the next episode of an env (its task) while the budgets allow.

    Args:
        num_envs: envs of the pool.
        tasks: the task of each episode (None: no tasks).
        total_episodes: episodes to start in all (None: no limit).
        episodes_per_env: episodes to start per env (None: no limit).

    A task handed out to an episode that failed comes back (:meth:`give_back`) and is the
    next one handed out, up to ``max_attempts`` episodes in all; then it is given up and
    listed in :attr:`failed` (as are those handed back that no env was left to run).

    Every task taken is, at any time, in :attr:`unfinished` (in the order taken) until its
    episode is handed out (:meth:`handed_out`) or it is given up.

    Example:
        >>> plan = EpisodePlan(2, tasks=iter([{"prompt": "a"}, {"prompt": "b"}]), total_episodes=None,
        ...     episodes_per_env=None)
        >>> plan.next(0), plan.next(1), plan.next(0)
        ((True, {'prompt': 'a'}), (True, {'prompt': 'b'}), (False, None))
        >>> plan.handed_out(plan.ended(1)); plan.unfinished
        [{'prompt': 'a'}]
    """

    def __init__(
        self,
        num_envs: int,
        *,
        tasks: Tasks | None,
        total_episodes: int | None,
        episodes_per_env: int | None,
        max_attempts: int = 3,
    ) -> None:
        self._by_env = [0] * num_envs
        self._started = 0
        self._total = total_episodes
        self._per_env = episodes_per_env
        self._call: Callable[[int, int], Any] | None = None
        self._iterator: Iterator[Any] | None = None
        if callable(tasks):
            self._call = tasks
        elif tasks is not None:
            self._iterator = iter(tasks)
        self._returned: deque[tuple[Any, int, int]] = deque()  # (task, attempts, number taken)
        self._attempts: dict[int, int] = {}  # env -> attempts of the returned task it runs
        self._running: dict[int, int] = {}  # env -> number of the task its episode runs
        self._taken: dict[int, Any] = {}  # number -> task, taken and not handed out, in order
        self._next_number = 0
        self._exhausted = False
        self._max_attempts = max_attempts
        #: tasks given up: failed ``max_attempts`` times, or handed back with no env left to run them
        self.failed: list[Any] = []

    def next(self, env_index: int) -> tuple[bool, Any]:
        """``(True, task)`` for the next episode of ``env_index``, or ``(False, None)``: no more."""
        if self._total is not None and self._started >= self._total:
            return False, None
        if self._per_env is not None and self._by_env[env_index] >= self._per_env:
            return False, None
        attempts = 0
        if self._returned:
            task, attempts, number = self._returned.popleft()
        else:
            if self._call is not None:
                task = self._call(env_index, self._by_env[env_index])
            elif self._iterator is not None:
                if self._exhausted:
                    return False, None
                try:
                    task = next(self._iterator)
                except StopIteration:
                    self._exhausted = True
                    return False, None
            else:
                task = None
            number = self._next_number
            self._next_number += 1
            if self._call is not None or self._iterator is not None:
                self._taken[number] = task
        self._started += 1
        self._by_env[env_index] += 1
        self._attempts[env_index] = attempts
        self._running[env_index] = number
        return True, task

    def ended(self, env_index: int) -> int:
        """The episode of ``env_index`` ended: the number of its task (see :meth:`handed_out`)."""
        self._attempts.pop(env_index, None)
        return self._running.pop(env_index, -1)

    def handed_out(self, number: int) -> None:
        """The episode of the task numbered ``number`` (:meth:`ended`) was handed out."""
        self._taken.pop(number, None)

    def give_back(self, env_index: int, task: Any) -> None:
        """An episode of ``env_index`` failed before it finished: it does not count, and its
        task (from an iterable) is handed out again."""
        self._started -= 1
        self._by_env[env_index] -= 1
        number = self._running.pop(env_index, -1)
        if self._iterator is not None:
            attempts = self._attempts.pop(env_index, 0) + 1
            if attempts >= self._max_attempts:
                self.failed.append(task)
                self._taken.pop(number, None)
            else:
                self._returned.append((task, attempts, number))
        else:
            self._taken.pop(number, None)  # a task function gives the env its next task anew

    def close(self) -> None:
        """The collection ended: tasks still handed back are given up."""
        for task, _, number in self._returned:
            self.failed.append(task)
            self._taken.pop(number, None)
        self._returned.clear()

    @property
    def started(self) -> int:
        """Episodes handed out so far."""
        return self._started

    @property
    def unfinished(self) -> list[Any]:
        """The tasks taken whose episodes were neither handed out nor given up, in the order taken."""
        return list(self._taken.values())

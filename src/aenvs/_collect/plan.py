"""Which episodes a collector runs: their tasks (reset options) and its budgets."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["EpisodePlan", "Tasks"]

Tasks = Callable[[int, int], Mapping[str, Any] | None] | Iterable[Mapping[str, Any] | None]
"""Reset options per episode: ``tasks(env_index, episode_number_of_that_env)``, or an
iterable of them taken in order as episodes start (a dataset of prompts)."""


class EpisodePlan:
    """Hands out the next episode of an env (its task) while the budgets allow.

    Args:
        num_envs: envs of the pool.
        tasks: reset options per episode (None: no options).
        total_episodes: episodes to start in all (None: no limit).
        episodes_per_env: episodes to start per env (None: no limit).

    A task handed out to an episode that failed comes back (:meth:`give_back`) and is the
    next one handed out, up to ``max_attempts`` episodes in all; then it is given up and
    listed in :attr:`failed` (as are those handed back that no env was left to run).

    Example:
        >>> plan = EpisodePlan(2, tasks=iter([{"prompt": "a"}, {"prompt": "b"}]), total_episodes=None,
        ...     episodes_per_env=None)
        >>> plan.next(0), plan.next(1), plan.next(0)
        ((True, {'prompt': 'a'}), (True, {'prompt': 'b'}), (False, None))
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
        self._call: Callable[[int, int], Mapping[str, Any] | None] | None = None
        self._iterator: Iterator[Mapping[str, Any] | None] | None = None
        if callable(tasks):
            self._call = tasks
        elif tasks is not None:
            self._iterator = iter(tasks)
        self._returned: deque[tuple[Mapping[str, Any] | None, int]] = deque()  # (task, attempts)
        self._attempts: dict[int, int] = {}  # env -> attempts of the returned task it runs
        self._exhausted = False
        self._max_attempts = max_attempts
        #: tasks given up: failed ``max_attempts`` times, or handed back with no env left to run them
        self.failed: list[Mapping[str, Any] | None] = []

    def next(self, env_index: int) -> tuple[bool, Mapping[str, Any] | None]:
        """``(True, task)`` for the next episode of ``env_index``, or ``(False, None)``: no more."""
        if self._total is not None and self._started >= self._total:
            return False, None
        if self._per_env is not None and self._by_env[env_index] >= self._per_env:
            return False, None
        attempts = 0
        if self._returned:
            task, attempts = self._returned.popleft()
        elif self._call is not None:
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
        self._started += 1
        self._by_env[env_index] += 1
        self._attempts[env_index] = attempts
        return True, task

    def give_back(self, env_index: int, task: Mapping[str, Any] | None) -> None:
        """An episode of ``env_index`` failed before it finished: it does not count, and its
        task (from an iterable) is handed out again."""
        self._started -= 1
        self._by_env[env_index] -= 1
        if self._iterator is not None:
            attempts = self._attempts.pop(env_index, 0) + 1
            if attempts >= self._max_attempts:
                self.failed.append(task)
            else:
                self._returned.append((task, attempts))

    def close(self) -> None:
        """The collection ended: tasks still handed back are given up."""
        self.failed.extend(task for task, _ in self._returned)
        self._returned.clear()

    @property
    def started(self) -> int:
        """Episodes handed out so far."""
        return self._started

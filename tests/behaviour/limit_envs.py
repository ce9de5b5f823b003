"""Envs for the limits and latency tests (module-level classes: the process and Ray executors
pickle them by reference)."""

from __future__ import annotations

import asyncio
import fcntl
import os
from typing import Any

from tensordict import TensorDictBase

from aenvs import EnvContext
from aenvs.testing import AsyncEchoEnv


class ConcurrencyCounter:
    """A count of envs inside a step now, and the highest count seen, kept in a file under an
    exclusive ``flock``: exact across threads and processes."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "concurrency")
        with open(self.path, "a"):
            pass

    def _update(self, change: int) -> None:
        with open(self.path, "r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            now, highest = (int(x) for x in (file.read().split() or ["0", "0"]))
            now += change
            file.seek(0)
            file.truncate()
            file.write(f"{now} {max(highest, now)}")

    def enter(self) -> None:
        self._update(1)

    def leave(self) -> None:
        self._update(-1)

    def read(self) -> tuple[int, int]:
        """(inside now, highest seen)."""
        with open(self.path) as file:
            fcntl.flock(file, fcntl.LOCK_SH)
            now, highest = (int(x) for x in (file.read().split() or ["0", "0"]))
        return now, highest


class CountingEnv(AsyncEchoEnv):
    """An async echo env whose step sleeps ``delay`` inside the counter, and leaves a file
    ``step-<env>-<n>`` in ``directory`` once its n-th step is done."""

    def __init__(self, env_index: int, directory: str, delay: float) -> None:
        super().__init__(env_index=env_index, delay=delay)
        self.directory = directory
        self.counter = ConcurrencyCounter(directory)

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        self.counter.enter()
        try:
            await asyncio.sleep(self.delay)  # type: ignore[arg-type]
            out = self._advance(td)
        finally:
            self.counter.leave()
        self._mark_done()
        return out

    def _mark_done(self) -> None:
        with open(os.path.join(self.directory, f"step-{self.env_index}-{self.steps}"), "w"):
            pass


def counting_env_fns(num_envs: int, directory: str, delay: float) -> list[Any]:
    def make(ctx: EnvContext) -> CountingEnv:
        return CountingEnv(ctx.env_index, directory, delay)

    return [make] * num_envs


class StairEnv(AsyncEchoEnv):
    """An async echo env whose k-th step (from 1) sleeps ``unit * (k % 10)`` seconds."""

    def __init__(self, env_index: int, unit: float) -> None:
        super().__init__(env_index=env_index)
        self.unit = unit

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        await asyncio.sleep(self.unit * ((self.steps + 1) % 10))
        return self._advance(td)


def stair_env_fns(num_envs: int, unit: float) -> list[Any]:
    def make(ctx: EnvContext) -> StairEnv:
        return StairEnv(ctx.env_index, unit)

    return [make] * num_envs

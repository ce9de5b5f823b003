"""Envs that log each construction and each ``close`` to files, so tests can count closes.

Every env object writes one line per event (``built`` / ``closed``) with its env index and
an id of its own (pid and a random part) to ``events.log`` under the directory its factory
names: a count that works across threads, processes and Ray actors alike. Lives in an
importable module so that the factories pickle by reference.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tensordict import TensorDictBase

from aenvs import EnvContext
from aenvs.testing import EchoEnv

Kind = Literal["sync", "async", "resource"]


def record(log_dir: str, event: str, env_index: int, uid: str) -> None:
    """Append one event line; one ``write`` on an O_APPEND file, so lines never interleave."""
    fd = os.open(Path(log_dir) / "events.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{event} {env_index} {uid}\n".encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Events:
    """What the env objects logged: per object id, its env index, and how often it closed."""

    built: dict[str, int]  # uid -> env index
    closes: Counter[str]  # uid -> closes
    hanging: list[str]  # uids whose step hangs now, or did

    @classmethod
    def read(cls, log_dir: str | Path) -> Events:
        path = Path(log_dir) / "events.log"
        built: dict[str, int] = {}
        closes: Counter[str] = Counter()
        hanging: list[str] = []
        if path.exists():
            for line in path.read_text().splitlines():
                event, index, uid = line.split()
                if event == "built":
                    built[uid] = int(index)
                elif event == "closed":
                    closes[uid] += 1
                else:
                    hanging.append(uid)
        return cls(built, closes, hanging)

    def unclosed(self) -> dict[str, int]:
        """Objects built and never closed: uid -> env index."""
        return {uid: i for uid, i in self.built.items() if self.closes[uid] == 0}

    def closed_twice(self) -> list[str]:
        return [uid for uid, n in self.closes.items() if n > 1]

    def per_env(self) -> Counter[int]:
        """Objects built per env index."""
        return Counter(self.built.values())


@dataclass(frozen=True)
class CountingFactory:
    """Builds a :class:`CountingEnv` (``kind="sync"``), :class:`AsyncCountingEnv` (``"async"``:
    ``async def`` step and close) or :class:`ResourceEnv` (``"resource"``: an async env holding a
    task on its loop that its close must cancel and await).

    ``hang`` maps env index -> the step (1-based, of each object) that hangs until the file
    ``release`` exists (first object only); ``raise_at`` env index -> the step of its first
    object that raises; ``sigkill_at`` env index -> the step at which its first object
    SIGKILLs its own process (process and ray executors only); ``bad_close`` env index ->
    whether its close raises or hangs (after logging the close).
    """

    log_dir: str
    kind: Kind = "sync"
    hang: tuple[tuple[int, int], ...] = ()
    release: str = ""
    raise_at: tuple[tuple[int, int], ...] = ()
    sigkill_at: tuple[tuple[int, int], ...] = ()
    bad_close: tuple[tuple[int, Literal["raise", "hang"]], ...] = ()  # env index -> how its close fails

    def __call__(self, ctx: EnvContext) -> EchoEnv:
        cls = {"sync": CountingEnv, "async": AsyncCountingEnv, "resource": ResourceEnv}[self.kind]
        return cls(ctx.env_index, self)


def _first_object(log_dir: str, env_index: int) -> bool:
    return Events.read(log_dir).per_env()[env_index] == 1


class CountingEnv(EchoEnv):
    """An echo env that logs its construction and each close; its faults come from its factory."""

    def __init__(self, env_index: int, factory: CountingFactory) -> None:
        super().__init__(env_index=env_index, fail_on_negative=False)
        self.log_dir = factory.log_dir
        self.uid = f"{os.getpid()}-{uuid.uuid4().hex[:10]}"
        record(self.log_dir, "built", env_index, self.uid)
        first = _first_object(self.log_dir, env_index)  # faults hit the env's first object only
        self.hang_at = dict(factory.hang).get(env_index) if first else None
        self.raise_at = dict(factory.raise_at).get(env_index) if first else None
        self.sigkill_at = dict(factory.sigkill_at).get(env_index) if first else None
        self.release = factory.release
        self.bad_close = dict(factory.bad_close).get(env_index)
        self.hung = False

    def _fault(self) -> None:
        if self.steps + 1 == self.raise_at:
            raise RuntimeError(f"env {self.env_index}: injected fault")
        if self.steps + 1 == self.sigkill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def _hanging(self) -> bool:
        hanging = self.steps + 1 == self.hang_at and not os.path.exists(self.release)
        if hanging and not self.hung:
            self.hung = True
            record(self.log_dir, "hanging", self.env_index, self.uid)
        return hanging

    def step(self, td: TensorDictBase) -> TensorDictBase:
        self._fault()
        while self._hanging():
            time.sleep(0.005)
        return self._advance(td)

    def close(self) -> None:
        record(self.log_dir, "closed", self.env_index, self.uid)
        if self.bad_close == "raise":
            raise RuntimeError(f"env {self.env_index}: its close failed")
        while self.bad_close == "hang":
            time.sleep(0.005)


class AsyncCountingEnv(CountingEnv):
    """:class:`CountingEnv` with ``async def`` step and close."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        self._fault()
        while self._hanging():  # noqa: ASYNC110 - the release may come from another process
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)
        return self._advance(td)

    async def close(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        record(self.log_dir, "closed", self.env_index, self.uid)
        if self.bad_close == "raise":
            raise RuntimeError(f"env {self.env_index}: its close failed")
        if self.bad_close == "hang":
            await asyncio.Event().wait()


class ResourceEnv(AsyncCountingEnv):
    """An async env holding a task on its loop (a sandbox's heartbeat, a client's reader):
    its close cancels and awaits it, which only works on the loop the env ran on."""

    def __init__(self, env_index: int, factory: CountingFactory) -> None:
        super().__init__(env_index, factory)
        self._heartbeat: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        await asyncio.Event().wait()  # held until cancelled

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())
        return await super().step(td)

    async def close(self) -> None:  # type: ignore[override]
        task = self._heartbeat
        if task is not None:
            task.cancel()
            try:
                await task  # raises RuntimeError on a loop other than the task's
            except asyncio.CancelledError:
                pass
        record(self.log_dir, "closed", self.env_index, self.uid)


async def wait_for_closes(log_dir: str | Path, expected: int, timeout: float = 30.0) -> Events:
    """The events, once at least ``expected`` closes were logged (or ``timeout`` passed):
    closes that happen after the pool returned (an abandoned thread's, a worker's) are
    awaited by polling the log, never by a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        events = Events.read(log_dir)
        if sum(events.closes.values()) >= expected or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.01)


def mixed(log_dir: str | Path, kinds: tuple[Kind, ...], **faults: Any) -> list[Any]:
    """One factory per env, of the kinds given (in env order), sharing ``faults``."""
    return [CountingFactory(str(log_dir), kind, **faults) for kind in kinds]

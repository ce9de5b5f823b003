"""What the serving tests share: the spaces, a trainer loop over a server's pool, raw clients."""

from __future__ import annotations

import asyncio
import json
import ssl
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from websockets.asyncio.client import ClientConnection, connect

from aenvs import AsyncEnvPool

TEXT = spaces.Text(64, charset=frozenset(string.ascii_letters + string.digits + "-:"))
WAIT = 20.0  # seconds any single wait of a test may take before it fails


def policy(observation: str) -> str:
    """The trainer's action on an observation (the clients check they got this one)."""
    return f"a:{observation}"[:64]


@dataclass
class Step:
    observation: str
    action: str
    reward: float
    next_observation: str
    terminated: bool
    truncated: bool
    disconnected: bool


@dataclass
class Trained:
    """What the trainer saw: per client episode, its first observation and its steps."""

    first: dict[str, str] = field(default_factory=dict)
    steps: dict[str, list[Step]] = field(default_factory=dict)

    @property
    def ended(self) -> int:
        return sum(
            1 for steps in self.steps.values() if steps and (steps[-1].terminated or steps[-1].truncated)
        )


def _column(td: TensorDictBase, *key: str) -> list[Any]:
    if key not in td.keys(include_nested=True):
        return [None] * td.batch_size[0]
    value = td.get(key)
    return value.tolist()


async def train(pool: AsyncEnvPool, episodes: int, *, timeout: float = WAIT) -> Trained:
    """Run the pool's slots until ``episodes`` client episodes ended (each wait bounded by ``timeout``).

    Every slot is reset, stepped with :func:`policy` until its episode ends, and reset
    again; slots still waiting for a client at the end are left to the pool's close.
    """
    seen = Trained()
    observations: dict[int, str] = {}
    episode_of: dict[int, str] = {}
    await pool.async_reset_send()
    resetting, stepping = set(range(pool.num_envs)), set[int]()

    async def step(envs: list[int]) -> None:
        td = TensorDict({}, [len(envs)])
        td["action"] = [policy(observations[i]) for i in envs]
        td["env_index"] = envs
        await pool.async_step_send(td)
        stepping.update(envs)

    while seen.ended < episodes:
        waits: dict[asyncio.Task[TensorDictBase], str] = {}
        if resetting:
            waits[asyncio.ensure_future(pool.async_reset_recv(min_get=1))] = "reset"
        if stepping:
            waits[asyncio.ensure_future(pool.async_step_recv(min_get=1))] = "step"
        assert waits, "nothing in flight, yet episodes are missing"
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()  # a cancelled receive loses nothing; one that finished meanwhile is kept
            await asyncio.wait(waits)
        for task, kind in waits.items():
            try:
                td = await task
            except asyncio.CancelledError:
                continue
            envs = td["env_index"].tolist()
            if kind == "reset":
                resetting.difference_update(envs)
                for i, obs, eid in zip(
                    envs, td["observation"].tolist(), _column(td, "info", "episode_id"), strict=True
                ):
                    observations[i], episode_of[i] = obs, eid
                    assert eid not in seen.first, f"episode {eid} reset twice"
                    seen.first[eid], seen.steps[eid] = obs, []
                await step(envs)
                continue
            stepping.difference_update(envs)
            rows = zip(
                envs,
                td["action"].tolist(),
                td["next", "reward"].flatten().tolist(),
                td["next", "observation"].tolist(),
                td["next", "terminated"].flatten().tolist(),
                td["next", "truncated"].flatten().tolist(),
                _column(td, "next", "info", "episode_id"),
                _column(td, "next", "info", "disconnected"),
                strict=True,
            )
            again, done = [], []
            for i, action, reward, obs, terminated, truncated, eid, gone in rows:
                assert eid == episode_of[i], f"env {i} ran {episode_of[i]}, its step says {eid}"
                seen.steps[eid].append(
                    Step(observations[i], action, reward, obs, terminated, truncated, bool(gone))
                )
                observations[i] = obs
                (done if terminated or truncated else again).append(i)
            if again:
                await step(again)
            if done:
                await pool.async_reset_send(env_index=done)
                resetting.update(done)
    return seen


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded by WAIT) until ``condition()``: for what the server does at its next turns."""
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - a condition checked each loop turn
            await asyncio.sleep(0.001)


class RawClient:
    """A client speaking the protocol by hand, to break it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def connect(
        cls, url: str, *, headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None
    ) -> RawClient:
        options: dict[str, Any] = {} if tls is None else {"ssl": tls}  # none: the scheme's default
        return cls(await connect(url, proxy=None, compression=None, additional_headers=headers, **options))

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(message if isinstance(message, str | bytes) else json.dumps(message))

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            return json.loads(await self.ws.recv())

    async def closed(self) -> tuple[int | None, str | None]:
        async with asyncio.timeout(WAIT):
            await self.ws.wait_closed()
        return self.ws.close_code, self.ws.close_reason

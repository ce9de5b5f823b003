"""The env slots of a server's pool: each runs one client episode after another."""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn, Protocol

import gymnasium as gym
from gymnasium import spaces

from aenvs._serving.episodes import Episode, EpisodeQueue, Stage
from aenvs._serving.protocol import encode

__all__ = ["SlotEnv", "SlotFactory"]

_EXECUTORS = (
    "the envs of an EnvServer are coroutines on the server's event loop: run their pool with "
    'executor="inline" on that loop (server.pool() does)'
)


class Hub(Protocol):
    """What a slot needs of its server."""

    @property
    def observation_space(self) -> spaces.Space[Any]: ...
    @property
    def action_space(self) -> spaces.Space[Any]: ...
    @property
    def episodes(self) -> EpisodeQueue: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...


class SlotEnv(gym.Env[Any, Any]):
    """A coroutine gymnasium env whose episodes are client episodes.

    ``reset`` waits for the next client episode whose first ``get_action`` arrived and
    returns that observation; ``step`` hands the action to the client and returns what it
    sent next: a ``get_action`` (reward: the returns logged since the last action), an
    ``end_episode`` (terminated, or truncated if the client said so) or the connection's
    end (truncated at the last observation). The info holds ``"episode_id"``, what the
    client logged with its returns and, after a step, ``"disconnected"`` (whether the step
    ended because the client went away).
    """

    metadata: dict[str, Any] = {}  # noqa: RUF012 - gymnasium's own attribute

    def __init__(self, hub: Hub) -> None:
        self.observation_space = hub.observation_space
        self.action_space = hub.action_space
        self._hub = hub
        self._episode: Episode | None = None

    @property
    def episode_id(self) -> str | None:
        """The id of the client episode this slot runs, if any."""
        return None if self._episode is None else self._episode.id

    async def reset(  # pyright: ignore[reportIncompatibleMethodOverride] - a coroutine env
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._give_up("the trainer reset its env in the middle of this episode")
        episode = await self._hub.episodes.get()
        self._episode = episode
        return episode.observation, {"episode_id": episode.id}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:  # pyright: ignore[reportIncompatibleMethodOverride]
        episode = self._episode
        if episode is None:
            raise RuntimeError("this env has no client episode: reset it first (its last episode ended)")
        try:
            await episode.act(encode(self.action_space, action))
        except asyncio.CancelledError:
            self._give_up("the trainer gave up on this step (its step_timeout, or the pool closing)")
            raise
        reward, info = episode.take_returns()
        info["disconnected"] = episode.gone  # in every step's info, so that batches stack densely
        if episode.stage is not Stage.ENDED:
            return episode.observation, reward, False, False, info
        self._episode = None
        return episode.observation, reward, not episode.truncated, episode.truncated, info

    def close(self) -> None:
        self._give_up("the trainer's pool closed")

    def _give_up(self, reason: str) -> None:
        episode, self._episode = self._episode, None
        if episode is not None:
            episode.abort(reason)


class SlotFactory:
    """``env_fns`` entry of an :class:`~aenvs.EnvServer`: builds a :class:`SlotEnv` on the
    server's loop, and refuses to leave it (other threads, processes, Ray)."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    def __call__(self) -> SlotEnv:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._hub.loop is None:
            raise RuntimeError("the EnvServer is not started: build its pool inside `async with server:`")
        if loop is not self._hub.loop:
            raise RuntimeError(_EXECUTORS)
        return SlotEnv(self._hub)

    def __reduce__(self) -> NoReturn:
        raise TypeError(_EXECUTORS)

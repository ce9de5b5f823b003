"""One client connection on the server: its messages, its episodes, and what it is sent."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import TYPE_CHECKING, Any, cast

from websockets.exceptions import ConnectionClosed

from aenvs._serving.episodes import Episode, EpisodeQueue, Stage
from aenvs._serving.protocol import ProtocolError, decode, dumps, fits, loads

if TYPE_CHECKING:
    from gymnasium import spaces
    from websockets.asyncio.server import ServerConnection

__all__ = ["Connection", "Registry"]


class Registry:
    """What every connection of a server shares: the spaces, the open episodes, the queue."""

    def __init__(self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.episodes: dict[str, Episode] = {}
        self.queue = EpisodeQueue()


class Connection:
    """Serves one websocket: reads its messages in order, writes through one writer task."""

    def __init__(self, ws: ServerConnection, registry: Registry) -> None:
        self._ws = ws
        self._registry = registry
        self._episodes: dict[str, Episode] = {}
        self._aborted: set[str] = set()  # given up by the trainer; the client may still send about them
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()

    # -- Link, for the episodes -----------------------------------------------------

    def post(self, message: dict[str, Any]) -> None:
        self._outbox.put_nowait(dumps(message))

    def release(self, episode: Episode, *, aborted: bool) -> None:
        if self._episodes.pop(episode.id, None) is episode:
            self._registry.episodes.pop(episode.id, None)
            if aborted:
                self._aborted.add(episode.id)

    # -- serving -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the client leaves, breaks the protocol, or the server closes; then end
        every episode still open as its client vanished."""
        writer = asyncio.create_task(self._write())
        try:
            async for text in self._ws:
                try:
                    self._dispatch(loads(text))
                except ProtocolError as exc:
                    self.post({"type": "error", "message": str(exc)})
                    self._outbox.put_nowait(None)  # the writer closes the connection after it
                    await writer
                    return
        except ConnectionClosed:
            pass
        finally:
            for episode in list(self._episodes.values()):
                self.release(episode, aborted=False)
                episode.vanish()
            if not writer.done():
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    async def _write(self) -> None:
        ws, outbox = self._ws, self._outbox
        try:
            while (text := await outbox.get()) is not None:
                await ws.send(text)
            await ws.close(1008, "protocol error")
        except ConnectionClosed:
            pass

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        episode_id = message.get("episode_id")
        if not isinstance(episode_id, str):
            raise ProtocolError(f'a "{kind}" message needs an "episode_id" string, got {episode_id!r}')
        if kind == "start_episode":
            self._start(episode_id)
            return
        if kind not in ("get_action", "log_returns", "end_episode"):
            raise ProtocolError(f"unknown message type {kind!r}")
        episode = self._episodes.get(episode_id)
        if episode is None:
            if episode_id in self._aborted:  # sent before the client heard the trainer gave it up
                if kind != "log_returns":  # it waits for an action, or may: tell it again
                    self.post({"type": "episode_aborted", "episode_id": episode_id, "reason": "given up"})
                return
            raise ProtocolError(f"{kind}: no open episode {episode_id!r} on this connection")
        if kind == "log_returns":
            episode.log_returns(_reward(message), _info(message))
            return
        if episode.stage is Stage.WAITING:
            raise ProtocolError(f"{kind} for episode {episode_id!r}, whose last get_action awaits its action")
        observation = self._observation(message)
        if kind == "get_action":
            first = episode.stage is Stage.NEW
            episode.observe(observation)
            if first:
                self._registry.queue.put(episode)
            return
        truncated = message.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ProtocolError(f'end_episode: "truncated" must be true or false, got {truncated!r}')
        self.release(episode, aborted=False)  # a slot running it keeps it until it reported the end
        episode.end(observation, truncated)

    def _start(self, episode_id: str) -> None:
        if episode_id in self._registry.episodes:
            raise ProtocolError(f"start_episode: episode {episode_id!r} is already open on this server")
        episode = Episode(episode_id, self)
        self._episodes[episode_id] = self._registry.episodes[episode_id] = episode
        self._aborted.discard(episode_id)

    def _observation(self, message: dict[str, Any]) -> Any:
        if "observation" not in message:
            raise ProtocolError(f'a "{message["type"]}" message needs an "observation"')
        space = self._registry.observation_space
        try:
            observation = decode(space, message["observation"])
        except ValueError as exc:
            raise ProtocolError(f"{message['type']}: bad observation: {exc}") from None
        if not fits(space, observation):
            raise ProtocolError(f"{message['type']}: the observation {observation!r} does not fit {space}")
        return observation


def _reward(message: dict[str, Any]) -> float:
    reward = message.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ProtocolError(f'log_returns: "reward" must be a finite number, got {reward!r}')
    return float(reward)


def _info(message: dict[str, Any]) -> dict[str, Any] | None:
    info = message.get("info")
    if info is not None and not isinstance(info, dict):
        raise ProtocolError(f'log_returns: "info" must be an object or null, got {info!r}')
    return cast("dict[str, Any] | None", info)

"""One client connection on the server: its messages, its episodes, and what it is sent."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from aenvs._serving.episodes import Episode, EpisodeQueue, Stage
from aenvs._serving.limits import Bucket, Limits
from aenvs._serving.protocol import ProtocolError, brief, check_info, decode, dumps, fits, loads

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


_KINDS = ("start_episode", "get_action", "log_returns", "end_episode")


class Connection:
    """Serves one websocket: reads its messages in order, writes through one writer task,
    and holds the client to the server's :class:`~aenvs._serving.limits.Limits`."""

    def __init__(self, ws: ServerConnection, registry: Registry, limits: Limits) -> None:
        self._ws = ws
        self._registry = registry
        self._limits = limits
        self._episodes: dict[str, Episode] = {}
        self._aborted: set[str] = set()  # given up by the trainer; the client may still send about them
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._active = self._loop.time()  # when a message last went either way
        rate = limits.max_messages_per_second
        self._bucket = None if rate is None else Bucket(rate, now=self._active)
        self._watchdog: asyncio.TimerHandle | None = None
        self._refused = False

    # -- Link, for the episodes -----------------------------------------------------

    def post(self, message: dict[str, Any]) -> None:
        self._outbox.put_nowait(dumps(message))
        self._active = self._loop.time()

    def release(self, episode: Episode, *, aborted: bool) -> None:
        if self._episodes.pop(episode.id, None) is episode:
            self._registry.episodes.pop(episode.id, None)
            if aborted:
                self._aborted.add(episode.id)

    # -- serving -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the client leaves, breaks the protocol or a limit, or the server closes;
        then end every episode still open as its client vanished."""
        writer = asyncio.create_task(self._write())
        idle = self._limits.idle_timeout
        if idle is not None:
            self._watchdog = self._loop.call_at(self._active + idle, self._watch)
        try:
            async for text in self._ws:
                if self._refused:
                    continue  # read until the close: unread messages would stall the close handshake
                self._active = now = self._loop.time()
                try:
                    if self._bucket is not None and not self._bucket.take(now=now):
                        raise ProtocolError(
                            f"more than {self._limits.max_messages_per_second:g} messages a second "
                            "(the server's max_messages_per_second)"
                        )
                    self._dispatch(loads(text))
                except ProtocolError as exc:
                    self._refuse(str(exc))
        except ConnectionClosed:
            pass
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
            for episode in list(self._episodes.values()):
                self.release(episode, aborted=False)
                episode.vanish()
            if not writer.done():
                if self._refused:
                    await writer  # the error goes out, then the close frame (within close_timeout)
                else:
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await writer

    def _refuse(self, why: str) -> None:
        """Tell the client why, then close its connection (1008); later messages are ignored."""
        if not self._refused:
            self._refused = True
            self.post({"type": "error", "message": why})
            self._outbox.put_nowait(None)  # the writer closes the connection after it

    def _watch(self) -> None:
        """The idle timeout: fires when nothing went either way for ``idle_timeout`` seconds,
        unless an episode of the client waits for its action (the wait is the trainer's)."""
        idle = self._limits.idle_timeout
        assert idle is not None
        now = self._loop.time()
        if now < self._active + idle:
            self._watchdog = self._loop.call_at(self._active + idle, self._watch)
        elif any(episode.stage is Stage.WAITING for episode in self._episodes.values()):
            self._active = now
            self._watchdog = self._loop.call_at(now + idle, self._watch)
        else:
            self._watchdog = None
            self._refuse(
                f"idle for {idle:g} s: no message either way and no episode waiting for an action "
                "(the server's idle_timeout)"
            )

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
        if kind not in _KINDS:
            raise ProtocolError(f"unknown message type {brief(kind)} (the types: {', '.join(_KINDS)})")
        episode_id = message.get("episode_id")
        if not isinstance(episode_id, str):
            raise ProtocolError(f'a "{kind}" message needs an "episode_id" string, got {brief(episode_id)}')
        if kind == "start_episode":
            self._start(episode_id)
            return
        episode = self._episodes.get(episode_id)
        if episode is None:
            if episode_id in self._aborted:  # sent before the client heard the trainer gave it up
                if kind != "log_returns":  # it waits for an action, or may: tell it again
                    self.post({"type": "episode_aborted", "episode_id": episode_id, "reason": "given up"})
                return
            raise ProtocolError(f"{kind}: no open episode {brief(episode_id)} on this connection")
        if kind == "log_returns":
            episode.log_returns(_reward(message), check_info(message.get("info")))
            return
        if episode.stage is Stage.WAITING:
            raise ProtocolError(
                f"{kind} for episode {brief(episode_id)}, whose last get_action awaits its action"
            )
        observation = self._observation(message)
        if kind == "get_action":
            first = episode.stage is Stage.NEW
            episode.observe(observation)
            if first:
                self._registry.queue.put(episode)
            return
        truncated = message.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ProtocolError(f'end_episode: "truncated" must be true or false, got {brief(truncated)}')
        self.release(episode, aborted=False)  # a slot running it keeps it until it reported the end
        episode.end(observation, truncated)

    def _start(self, episode_id: str) -> None:
        if episode_id in self._registry.episodes:
            raise ProtocolError(f"start_episode: episode {brief(episode_id)} is already open on this server")
        most = self._limits.max_episodes
        if most is not None and len(self._episodes) >= most:
            raise ProtocolError(
                f"start_episode: {len(self._episodes)} episodes are open on this connection, the "
                "server's max_episodes_per_connection (end one before starting another)"
            )
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
            raise ProtocolError(
                f"{message['type']}: the observation {brief(observation)} does not fit {space}"
            )
        return observation


def _reward(message: dict[str, Any]) -> float:
    reward = message.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not _finite(reward):
        raise ProtocolError(f'log_returns: "reward" must be a finite number, got {brief(reward)}')
    return float(reward)


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer beyond any float
        return False

"""Client episodes on the server side, and the queue of those waiting for an env slot."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import Any, Protocol

from aenvs._serving.protocol import PolicyServerError

__all__ = ["Episode", "EpisodeQueue", "Link", "Stage"]


class Stage(enum.Enum):
    """Where a client episode stands.

    NEW: started, no observation yet. WAITING: its client waits for an action on
    ``observation``. ACTING: the action is with the client; the slot waits for what
    follows. ENDED: the client ended it, or went away (``gone``), or the trainer gave it up.
    """

    NEW = "new"
    WAITING = "waiting"
    ACTING = "acting"
    ENDED = "ended"


class Link(Protocol):
    """The connection an episode came over, as the episode sees it."""

    def post(self, message: dict[str, Any]) -> None:
        """Queue a message to the client (never blocks)."""
        ...

    def release(self, episode: Episode, *, aborted: bool) -> None:
        """Forget an ended episode (``aborted``: the trainer gave it up, its client may still
        send about it)."""
        ...


class Episode:
    """One client episode: what its client sent, and the wake-up of the slot running it."""

    __slots__ = ("_changed", "gone", "id", "info", "link", "observation", "reward", "stage", "truncated")

    def __init__(self, episode_id: str, link: Link) -> None:
        self.id = episode_id
        self.link = link
        self.stage = Stage.NEW
        self.observation: Any = None  # the last one received
        self.reward = 0.0  # logged since the last action
        self.info: dict[str, Any] = {}
        self.truncated = False
        self.gone = False  # ended by its connection closing
        self._changed: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"Episode({self.id!r}, {self.stage.value})"

    # -- from the client -----------------------------------------------------------

    def observe(self, observation: Any) -> None:
        """A ``get_action``: the client waits for an action on ``observation``."""
        self.observation = observation
        self.stage = Stage.WAITING
        self._wake()

    def log_returns(self, reward: float, info: dict[str, Any] | None) -> None:
        self.reward += reward
        if info:
            self.info.update(info)

    def end(self, observation: Any, truncated: bool) -> None:
        self.observation = observation
        self.truncated = truncated
        self.stage = Stage.ENDED
        self._wake()

    def vanish(self) -> None:
        """Its connection closed: the episode ends truncated, at its last observation."""
        if self.stage is not Stage.ENDED:
            self.gone = self.truncated = True
            self.stage = Stage.ENDED
            self._wake()

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None and not changed.done():
            changed.set_result(None)

    # -- from the slot env -----------------------------------------------------------

    async def act(self, action: Any) -> None:
        """Hand ``action`` (a JSON value) to the waiting client; return once it answered."""
        if self.stage is not Stage.WAITING:
            return  # ended meanwhile: the step reports that
        self._changed = changed = asyncio.get_running_loop().create_future()
        self.stage = Stage.ACTING
        self.link.post({"type": "action", "episode_id": self.id, "action": action})
        try:
            await changed
        finally:
            self._changed = None

    def take_returns(self) -> tuple[float, dict[str, Any]]:
        """The reward and info logged since the last action (the info with ``"episode_id"``)."""
        reward, info = self.reward, self.info
        self.reward, self.info = 0.0, {}
        return reward, {**info, "episode_id": self.id}

    def abort(self, reason: str) -> None:
        """The trainer gives this episode up: its client hears why, the server forgets it."""
        if self.stage is Stage.ENDED:
            return
        self.stage = Stage.ENDED
        self.link.post({"type": "episode_aborted", "episode_id": self.id, "reason": reason})
        self.link.release(self, aborted=True)


class EpisodeQueue:
    """Episodes whose first observation arrived, first come first served, and the slots
    waiting for one."""

    def __init__(self) -> None:
        self._ready: deque[Episode] = deque()
        self._waiting: deque[asyncio.Future[Episode]] = deque()
        self._closed: str | None = None

    def __len__(self) -> int:
        return sum(1 for episode in self._ready if episode.stage is Stage.WAITING)

    def put(self, episode: Episode) -> None:
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(episode)
                return
        self._ready.append(episode)

    async def get(self) -> Episode:
        """The next episode to run, once there is one; PolicyServerError once the server closed."""
        while self._ready:
            episode = self._ready.popleft()
            if episode.stage is Stage.WAITING:  # else its client went away while it waited
                return episode
        if self._closed is not None:
            raise PolicyServerError(self._closed)
        slot: asyncio.Future[Episode] = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        try:
            episode = await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled() and slot.exception() is None:
                # handed over in the loop turn the slot was cancelled in: first in line again
                self._ready.appendleft(slot.result())
            else:
                self._discard(slot)
            raise
        if episode.stage is not Stage.WAITING:
            return await self.get()
        return episode

    def _discard(self, slot: asyncio.Future[Episode]) -> None:
        try:
            self._waiting.remove(slot)
        except ValueError:
            pass

    def close(self, reason: str) -> None:
        """Fail every slot waiting, and every later :meth:`get`, with ``reason``."""
        self._closed = reason
        self._ready.clear()
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_exception(PolicyServerError(reason))

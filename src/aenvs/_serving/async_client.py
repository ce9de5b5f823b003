"""AsyncPolicyClient: a simulator's asyncio connection to an EnvServer, many episodes at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from ssl import SSLContext
from typing import Any, Self

from gymnasium import spaces
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from aenvs._serving.client_base import ClientCore
from aenvs._serving.protocol import MAX_MESSAGE_SIZE, PolicyServerError, ProtocolError, loads

__all__ = ["AsyncPolicyClient"]


class AsyncPolicyClient:
    """A simulator's asyncio connection to an :class:`~aenvs.EnvServer`.

    The methods of :class:`~aenvs.PolicyClient`, as coroutines, with the same arguments and
    errors. Any number of episodes run concurrently over one client (one task each, say):
    a task reads the server's messages and hands each action to the ``get_action``
    waiting for it. Connects on first use, or on entering ``async with``.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncPolicyClient, PolicyServerError
        >>> async def main():
        ...     async with AsyncPolicyClient("ws://127.0.0.1:9", open_timeout=5) as client:
        ...         pass
        >>> try:
        ...     asyncio.run(main())
        ... except PolicyServerError as exc:
        ...     print(str(exc).startswith("cannot reach ws://127.0.0.1:9"))
        True
    """

    def __init__(
        self,
        url: str,
        *,
        observation_space: spaces.Space[Any] | None = None,
        action_space: spaces.Space[Any] | None = None,
        token: str | None = None,
        ssl: SSLContext | None = None,
        open_timeout: float | None = 10.0,
        max_message_size: int = MAX_MESSAGE_SIZE,
    ) -> None:
        self._core = ClientCore(
            url, observation_space, action_space, token=token, ssl=ssl, max_message_size=max_message_size
        )
        self._open_timeout = open_timeout
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._connecting = asyncio.Lock()
        self._closed = False

    async def connect(self) -> Self:
        """Open the connection (the first call does it by itself). Idempotent."""
        await self._connection()
        return self

    async def start_episode(self, episode_id: str | None = None) -> str:
        """Start an episode and return its id (``episode_id``, or a new one)."""
        episode_id, text = self._core.start(episode_id)
        await self._send(text)
        return episode_id

    async def get_action(self, episode_id: str, observation: Any) -> Any:
        """Send ``observation`` and wait for the trainer's action on it."""
        text = self._core.get_action(episode_id, observation)
        if episode_id in self._pending:
            raise ValueError(f"episode {episode_id!r} already waits for an action (one get_action at a time)")
        ws = await self._connection()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[episode_id] = waiter
        try:
            await self._send(text, ws)
            return self._core.action(await waiter)
        finally:
            if self._pending.get(episode_id) is waiter:
                del self._pending[episode_id]

    async def log_returns(
        self, episode_id: str, reward: float, info: Mapping[str, Any] | None = None
    ) -> None:
        """Add ``reward`` to the reward of the episode's next step (and ``info`` to its info)."""
        await self._send(self._core.log_returns(episode_id, reward, info))

    async def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode at ``observation``: terminated, or ``truncated`` (a time limit)."""
        await self._send(self._core.end_episode(episode_id, observation, truncated))

    async def close(self) -> None:
        """Close the connection; its open episodes end truncated on the server. Idempotent."""
        self._closed = True
        self._core.fail(PolicyServerError("this AsyncPolicyClient is closed"))
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncPolicyClient({self._core.url!r})"

    async def _connection(self) -> ClientConnection:
        if self._core.failure is not None:
            raise self._core.failure
        if self._ws is None:
            async with self._connecting:
                if self._closed:
                    raise PolicyServerError("this AsyncPolicyClient is closed")
                if self._ws is None:
                    try:
                        ws = await connect(
                            self._core.url, open_timeout=self._open_timeout, **self._core.connect_options
                        )
                    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
                        raise self._core.unreachable(exc) from exc
                    self._ws = ws
                    self._reader = asyncio.create_task(self._read(ws))
        return self._ws

    async def _send(self, text: str, ws: ClientConnection | None = None) -> None:
        if ws is None:
            ws = await self._connection()
        try:
            await ws.send(text)
        except ConnectionClosed as exc:
            raise self._core.closed(exc) from None

    async def _read(self, ws: ClientConnection) -> None:
        """Hand each action to its waiting ``get_action``; fail them all when the connection ends."""
        core = self._core
        try:
            async for text in ws:
                try:
                    message = loads(text)
                except ProtocolError as exc:
                    core.fail(PolicyServerError(f"the server sent a bad message: {exc}"))
                    break
                got = core.heard(message)
                episode_id = got[0] if got is not None else str(message.get("episode_id"))
                waiter = self._pending.get(episode_id)
                if waiter is not None and not waiter.done():
                    if got is not None:
                        waiter.set_result(got[1])
                    elif episode_id in core.aborted:
                        try:
                            core.check(episode_id)
                        except PolicyServerError as exc:
                            waiter.set_exception(exc)
                if core.failure is not None:
                    break
        except ConnectionClosed as exc:
            core.closed(exc)
        finally:
            if core.failure is None:
                code, reason = ws.close_code, ws.close_reason
                core.fail(
                    PolicyServerError(f"the connection to {core.url} closed ({code} {reason or ''})".strip())
                )
            failure = core.failure
            assert failure is not None
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(failure)
            with contextlib.suppress(Exception):
                await ws.close()

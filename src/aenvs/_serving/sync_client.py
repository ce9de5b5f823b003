"""PolicyClient: a simulator's blocking connection to an EnvServer."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from ssl import SSLContext
from typing import Any, Self, cast

from gymnasium import spaces
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from aenvs._serving.client_base import ClientCore
from aenvs._serving.protocol import MAX_MESSAGE_SIZE, PolicyServerError, ProtocolError, loads

__all__ = ["PolicyClient"]


class PolicyClient:
    """A simulator's synchronous connection to an :class:`~aenvs.EnvServer` (RLlib's ``PolicyClient``).

    Connects on first use (or on entering ``with``). Episodes run one after the other or
    interleaved over one client, one call at a time: calls from several threads are
    serialized, and a ``get_action`` holds the connection until its action comes, so give
    each thread that runs episodes at the same time a client of its own (or use
    :class:`~aenvs.AsyncPolicyClient`, which runs any number concurrently).

    A failure is a :class:`~aenvs.PolicyServerError`: the server refused this client (a
    missing or wrong token), closed its connection (a message that broke the protocol, a
    limit passed), gave the episode up (its pool reset it, closed, or a step outlived the
    pool's ``step_timeout``: that episode's calls fail, the client carries on), or the
    connection closed (every later call fails).

    Args:
        url: the server's :attr:`~aenvs.EnvServer.url` (``wss://`` for a server with TLS).
        observation_space: encode observations with it (else arrays go as plain lists).
        action_space: decode actions with it (else they come as JSON: an int for
            ``Discrete``, a list for ``Box``).
        token: the server's token, if it has one (None: the ``AENVS_SERVE_TOKEN``
            environment variable's, if set).
        ssl: the :class:`ssl.SSLContext` to check the server's certificate with, for a
            ``wss://`` url (None: the system's trusted authorities); for a self-signed
            certificate, ``ssl.create_default_context(cafile="cert.pem")``.
        open_timeout: seconds connecting may take.
        max_message_size: bytes a message from the server may hold.

    Example:
        >>> from aenvs import PolicyClient
        >>> client = PolicyClient("ws://127.0.0.1:8765")  # nothing happens until the first call
        >>> client.close()
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
        self._lock = threading.Lock()
        self._closed = False

    def start_episode(self, episode_id: str | None = None) -> str:
        """Start an episode and return its id (``episode_id``, or a new one). Does not wait
        for an env slot: the first :meth:`get_action` does."""
        with self._lock:
            episode_id, text = self._core.start(episode_id)
            self._send(text)
            return episode_id

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Send ``observation`` and wait for the trainer's action on it."""
        with self._lock:
            self._send(self._core.get_action(episode_id, observation))
            while True:
                got = self._core.heard(self._recv())
                if got is not None and got[0] == episode_id:
                    return self._core.action(got[1])
                self._core.check(episode_id)  # given up, or the connection failed

    def log_returns(self, episode_id: str, reward: float, info: Mapping[str, Any] | None = None) -> None:
        """Add ``reward`` to the reward of the episode's next step (and ``info`` to its info)."""
        with self._lock:
            self._send(self._core.log_returns(episode_id, reward, info))

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode at ``observation``: terminated, or ``truncated`` (a time limit)."""
        with self._lock:
            self._send(self._core.end_episode(episode_id, observation, truncated))

    def close(self) -> None:
        """Close the connection; its open episodes end truncated on the server. Idempotent."""
        self._closed = True
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()

    def __enter__(self) -> Self:
        with self._lock:
            self._connection()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PolicyClient({self._core.url!r})"

    def _connection(self) -> ClientConnection:
        if self._closed:
            raise PolicyServerError("this PolicyClient is closed")
        if self._core.failure is not None:
            raise self._core.failure
        ws = self._ws
        if ws is None:
            try:
                ws = cast(
                    "ClientConnection",
                    connect(self._core.url, open_timeout=self._open_timeout, **self._core.connect_options),
                )
            except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
                raise self._core.unreachable(exc) from exc
            # held as a context manager (close() ends it): websockets 17 deprecates using the
            # connection otherwise, and its opt-out (legacy=True) is unknown to older versions
            ws.__enter__()
            self._ws = ws
        return ws

    def _send(self, text: str) -> None:
        ws = self._connection()
        try:
            ws.send(text)
        except ConnectionClosed as exc:
            raise self._core.closed(exc) from None

    def _recv(self) -> dict[str, Any]:
        ws = self._connection()
        try:
            return loads(ws.recv())
        except ConnectionClosed as exc:
            raise self._core.closed(exc) from None
        except ProtocolError as exc:
            self._core.fail(PolicyServerError(f"the server sent a bad message: {exc}"))
            raise self._core.failure from None  # pyright: ignore[reportGeneralTypeIssues]

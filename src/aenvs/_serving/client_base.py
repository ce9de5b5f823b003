"""What the sync and the async policy client share: the messages and what the server says back."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from ssl import SSLContext
from typing import Any, cast

from gymnasium import spaces
from websockets.exceptions import ConnectionClosed, InvalidStatus

from aenvs._serving.auth import bearer, resolve_token
from aenvs._serving.protocol import PolicyServerError, decode, dumps, encode, plain_json

__all__ = ["ClientCore"]


class ClientCore:
    """Builds a client's messages and reads the server's, with no I/O of its own.

    Observations are encoded with ``observation_space`` when given (else as plain JSON:
    arrays as lists); actions are decoded with ``action_space`` when given (else left
    as the JSON value: an int for ``Discrete``, a list for ``Box``, a string for ``Text``).
    """

    def __init__(
        self,
        url: str,
        observation_space: spaces.Space[Any] | None,
        action_space: spaces.Space[Any] | None,
        *,
        token: str | None,
        ssl: SSLContext | None,
        max_message_size: int,
    ) -> None:
        if not isinstance(cast(object, url), str) or not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must be a ws:// or wss:// address (EnvServer.url), got {url!r}")
        for name, space in (("observation_space", observation_space), ("action_space", action_space)):
            if space is not None and not isinstance(cast(object, space), spaces.Space):
                raise TypeError(f"{name} must be a gymnasium space or None, got {type(space).__name__}")
        if ssl is not None:
            if not isinstance(cast(object, ssl), SSLContext):
                raise TypeError(f"ssl must be an ssl.SSLContext or None, got {type(ssl).__name__}")
            if not url.startswith("wss://"):
                raise ValueError(f"ssl= is for a wss:// address (a server with TLS), got {url!r}")
        self.url = url
        self._observation_space = observation_space
        self._action_space = action_space
        # the websocket options of both clients: the token in the handshake; no proxy (a
        # loopback server behind an http_proxy of the environment would be unreachable); no
        # compression (small JSON messages, where latency counts)
        self.connect_options: dict[str, Any] = {
            "additional_headers": bearer(resolve_token(token)),
            "proxy": None,
            "compression": None,
            "max_size": max_message_size,
        }
        if ssl is not None:
            self.connect_options["ssl"] = ssl
        self.failure: PolicyServerError | None = None  # once set, every call raises it
        self.aborted: dict[str, str] = {}  # episodes the trainer gave up: why

    def start(self, episode_id: str | None) -> tuple[str, str]:
        """The id (a new one if None) and the message starting an episode."""
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        elif not isinstance(cast(object, episode_id), str) or not episode_id:
            raise TypeError(f"episode_id must be a non-empty str or None, got {episode_id!r}")
        self.aborted.pop(episode_id, None)
        return episode_id, dumps({"type": "start_episode", "episode_id": episode_id})

    def get_action(self, episode_id: str, observation: Any) -> str:
        self.check(episode_id)
        obs = self._observation(observation)
        return dumps({"type": "get_action", "episode_id": episode_id, "observation": obs})

    def log_returns(self, episode_id: str, reward: float, info: Mapping[str, Any] | None) -> str:
        self.check(episode_id)
        if (
            isinstance(reward, bool)
            or not isinstance(cast(object, reward), int | float)
            or not math.isfinite(reward)
        ):
            raise TypeError(f"reward must be a finite number, got {reward!r}")
        if info is not None and not isinstance(cast(object, info), Mapping):
            raise TypeError(f"info must be a mapping or None, got {type(info).__name__}")
        return dumps(
            {
                "type": "log_returns",
                "episode_id": episode_id,
                "reward": float(reward),
                "info": None if info is None else plain_json(info),
            }
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool) -> str:
        self.check(episode_id)
        if not isinstance(cast(object, truncated), bool):
            raise TypeError(f"truncated must be a bool, got {truncated!r}")
        obs = self._observation(observation)
        return dumps(
            {"type": "end_episode", "episode_id": episode_id, "observation": obs, "truncated": truncated}
        )

    def _observation(self, observation: Any) -> Any:
        space = self._observation_space
        return plain_json(observation) if space is None else encode(space, observation)

    def action(self, value: Any) -> Any:
        """An action as the client hands it out; PolicyServerError if it fits not the action space."""
        space = self._action_space
        if space is None:
            return value
        try:
            return decode(space, value)
        except ValueError as exc:
            raise PolicyServerError(
                f"the server sent an action this client's action_space refuses: {exc}"
            ) from None

    def check(self, episode_id: str) -> None:
        """Raise what ended this connection, or this episode."""
        if not isinstance(cast(object, episode_id), str):
            raise TypeError(f"episode_id must be a str (from start_episode), got {episode_id!r}")
        if self.failure is not None:
            raise self.failure
        reason = self.aborted.get(episode_id)
        if reason is not None:
            raise PolicyServerError(f"episode {episode_id!r} was given up by the trainer: {reason}")

    def heard(self, message: dict[str, Any]) -> tuple[str, Any] | None:
        """Take in a message of the server: ``(episode_id, JSON action)`` for an action (see
        :meth:`action`), else None (an abort is recorded; an error becomes :attr:`failure`)."""
        kind = message.get("type")
        if kind == "action":
            return str(message.get("episode_id")), message.get("action")
        if kind == "episode_aborted":
            self.aborted.setdefault(str(message.get("episode_id")), str(message.get("reason")))
        elif kind == "error":
            self.fail(
                PolicyServerError(f"the server closed this client's connection: {message.get('message')}")
            )
        else:
            self.fail(PolicyServerError(f"the server sent an unknown message: {message!r}"))
        return None

    def unreachable(self, exc: Exception) -> PolicyServerError:
        """The failure a connection that could not open is: the server refused the handshake
        (a missing or wrong token: its reason), or could not be reached."""
        if isinstance(exc, InvalidStatus):
            response = exc.response
            why = (
                response.body.decode("utf-8", "replace").strip() if response.body else response.reason_phrase
            )
            failure = PolicyServerError(
                f"the server at {self.url} refused this client (HTTP {response.status_code}): {why}"
            )
            failure.__cause__ = exc
            self.fail(failure)
            return failure
        return self.closed(OSError(str(exc)))

    def closed(self, exc: ConnectionClosed | OSError) -> PolicyServerError:
        """The failure a closed (or unreachable) connection is, kept for every later call."""
        if self.failure is None:
            if isinstance(exc, ConnectionClosed):
                rcvd = exc.rcvd
                why = f"{rcvd.code} {rcvd.reason}".strip() if rcvd is not None else "no close frame"
                self.failure = PolicyServerError(f"the connection to {self.url} closed ({why})")
            else:
                self.failure = PolicyServerError(f"cannot reach {self.url}: {exc}")
            self.failure.__cause__ = exc
        return self.failure

    def fail(self, failure: PolicyServerError) -> None:
        if self.failure is None:
            self.failure = failure

"""Who may connect: the shared token, checked in the websocket handshake, and loopback hosts.

A server with a token accepts a connection only if its opening HTTP request carries
``Authorization: Bearer <token>``; any other is answered ``401 Unauthorized`` (with a
line saying why) and never becomes a websocket, so it never reaches the pool.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from http import HTTPStatus
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response

__all__ = ["TOKEN_ENV", "Gate", "bearer", "is_loopback", "resolve_token"]

TOKEN_ENV = "AENVS_SERVE_TOKEN"
"""The environment variable the server and the clients read the token from when not given one."""


def resolve_token(token: str | None) -> str | None:
    """``token``, else the value of ``AENVS_SERVE_TOKEN`` (surrounding whitespace dropped), else None.

    A token is printable ASCII without spaces, as an HTTP header carries it; anything else
    is refused naming where it came from.

    Example:
        >>> resolve_token("s3cret-token")
        's3cret-token'
        >>> resolve_token("two words")
        Traceback (most recent call last):
        ...
        ValueError: token must be printable ASCII without spaces (an HTTP header carries it)
    """
    source = "token"
    if token is None:
        token = os.environ.get(TOKEN_ENV, "").strip() or None
        if token is None:
            return None
        source = TOKEN_ENV
    if not isinstance(cast(object, token), str):
        raise TypeError(f"{source} must be a str or None, got {type(token).__name__}")
    if not token:
        raise ValueError(f"{source} must not be empty")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source} must be printable ASCII without spaces (an HTTP header carries it)")
    return token


def bearer(token: str | None) -> dict[str, str]:
    """The handshake headers a client sends: ``Authorization: Bearer <token>``, if it has one."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only this machine reaches it.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0"), is_loopback("trainer.lan")
        (True, True, False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name (it may resolve anywhere) or every interface ("")
        return False


class Gate:
    """The websockets ``process_request`` hook of a server with a token: refuses with 401 every
    handshake without ``Authorization: Bearer <token>``, comparing in constant time."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        sent = request.headers.get_all("Authorization")
        if not sent:
            return _refuse(
                connection,
                f"this server requires a token: send the header 'Authorization: Bearer <token>' "
                f"(the aenvs clients do, given token= or the {TOKEN_ENV} environment variable)",
            )
        scheme, _, given = sent[0].partition(" ")
        # compared even when malformed, so that the time taken tells nothing
        matches = hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), self._expected)
        if len(sent) > 1 or scheme.lower() != "bearer" or not matches:
            return _refuse(connection, "the token this client sent is not this server's")
        return None


def _refuse(connection: ServerConnection, why: str) -> Response:
    response = connection.respond(HTTPStatus.UNAUTHORIZED, why + "\n")
    response.headers["WWW-Authenticate"] = 'Bearer realm="aenvs"'
    return response

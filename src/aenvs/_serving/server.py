"""EnvServer: simulators connect in, and each client episode becomes an env of a pool."""

from __future__ import annotations

import asyncio
import contextlib
from ssl import PROTOCOL_TLS_CLIENT, SSLContext
from typing import TYPE_CHECKING, Any, Self, cast

from gymnasium import spaces
from websockets.asyncio.server import Server, ServerConnection, serve as _listen

from aenvs._serving.auth import TOKEN_ENV, Gate, is_loopback, resolve_token
from aenvs._serving.connection import Connection, Registry
from aenvs._serving.episodes import EpisodeQueue
from aenvs._serving.limits import Limits
from aenvs._serving.protocol import MAX_MESSAGE_SIZE
from aenvs._serving.slot_env import SlotEnv, SlotFactory

if TYPE_CHECKING:
    from collections.abc import Callable

    from aenvs._pool import AsyncEnvPool

__all__ = ["MAX_EPISODES_PER_CONNECTION", "EnvServer", "serve"]

MAX_EPISODES_PER_CONNECTION = 1024
"""Episodes one client connection may have open at once, by default."""


class EnvServer:
    """A websocket server whose client episodes are the envs of a pool (RLlib's external env).

    Simulators the trainer does not start connect with a :class:`~aenvs.PolicyClient` or
    :class:`~aenvs.AsyncPolicyClient` and ask for actions; each of the ``num_envs`` env
    slots of the pool runs one client episode after another. Build it with
    :func:`aenvs.serve`; its pool with :meth:`pool` (or ``AsyncEnvPool(server.env_fns,
    executor="inline")``) inside ``async with server:``. The slots are coroutines on the
    server's loop: only the inline executor runs them (others are refused). Who may
    connect (a token, TLS) and what a connection may do (its limits) are arguments of
    :func:`aenvs.serve`.

    Example:
        >>> import asyncio, torch
        >>> from gymnasium import spaces
        >>> import aenvs
        >>> async def simulator(url):
        ...     async with aenvs.AsyncPolicyClient(url) as client:
        ...         eid = await client.start_episode()
        ...         action = await client.get_action(eid, [0.0])
        ...         await client.log_returns(eid, 1.0)
        ...         await client.end_episode(eid, [float(action)])
        >>> async def main():
        ...     server = aenvs.serve(2, spaces.Box(-5, 5, (1,)), spaces.Discrete(3))
        ...     async with server, server.pool() as pool:
        ...         sim = asyncio.create_task(simulator(server.url))
        ...         await pool.async_reset_send(env_index=[0])
        ...         td = await pool.async_reset_recv(min_get=1)
        ...         td["action"] = torch.tensor([2])
        ...         out = await pool.step(td)
        ...         await sim
        ...     return out["next", "observation"].tolist(), out["next", "reward"].tolist(), out["next", "terminated"].tolist()
        >>> asyncio.run(main())
        ([[2.0]], [[1.0]], [[True]])
    """

    def __init__(
        self,
        num_envs: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        ssl: SSLContext | None = None,
        insecure: bool = False,
        max_message_size: int = MAX_MESSAGE_SIZE,
        max_episodes_per_connection: int | None = MAX_EPISODES_PER_CONNECTION,
        max_messages_per_second: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(cast(object, num_envs), int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        for name, space in (("observation_space", observation_space), ("action_space", action_space)):
            if not isinstance(cast(object, space), spaces.Space):
                raise TypeError(f"{name} must be a gymnasium space, got {type(space).__name__}")
        if not isinstance(cast(object, host), str):
            raise TypeError(f"host must be a str, got {type(host).__name__}")
        if not isinstance(cast(object, port), int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in [0, 65535] (0: pick a free one), got {port!r}")
        if ssl is not None:
            _serve_tls(ssl)
        token = resolve_token(token)
        if token is None and not insecure and not is_loopback(host):
            raise ValueError(
                f"host={host!r} is not a loopback address and the server has no token: anyone who "
                "reaches it could start episodes, feed observations into the training data and read "
                f"the policy's actions. Pass token= (or set {TOKEN_ENV}), with ssl= across networks "
                "you do not trust; or insecure=True to serve it open all the same"
            )
        self.num_envs = num_envs
        self.host = host
        self._port = port
        self._gate = None if token is None else Gate(token)
        self._ssl = ssl
        self._max_size = max_message_size
        self._limits = Limits(max_episodes_per_connection, max_messages_per_second, idle_timeout)
        self._registry = Registry(observation_space, action_space)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Server | None = None
        self._closed = False
        self._connections: set[Connection] = set()
        self._factory = SlotFactory(self)

    # -- what the slots need (slot_env.Hub) ----------------------------------------------

    @property
    def observation_space(self) -> spaces.Space[Any]:
        return self._registry.observation_space

    @property
    def action_space(self) -> spaces.Space[Any]:
        return self._registry.action_space

    @property
    def episodes(self) -> EpisodeQueue:
        return self._registry.queue

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the server runs on (None before :meth:`start`)."""
        return self._loop

    # -- public -----------------------------------------------------------------------

    @property
    def env_fns(self) -> list[Callable[[], SlotEnv]]:
        """One factory per env slot, for ``AsyncEnvPool(server.env_fns, executor="inline")``."""
        return [self._factory] * self.num_envs

    @property
    def port(self) -> int:
        """The port listened on (the one picked, for ``port=0``, once started)."""
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """``ws://host:port`` (``wss://`` with TLS), for the clients; known once the server started.

        A server listening on every interface (``host="0.0.0.0"``) gives that address: the
        clients on other machines use a name or address of this one instead.
        """
        if self._server is None:
            raise RuntimeError(
                "the server is not started: use `async with server:` or `await server.start()`"
            )
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'ws' if self._ssl is None else 'wss'}://{host}:{self.port}"

    @property
    def requires_token(self) -> bool:
        """Whether clients must send the server's token (see :func:`aenvs.serve`)."""
        return self._gate is not None

    @property
    def num_connections(self) -> int:
        """Clients connected now."""
        return len(self._connections)

    @property
    def num_queued(self) -> int:
        """Client episodes waiting for an env slot (their first ``get_action`` arrived)."""
        return len(self._registry.queue)

    @property
    def num_open_episodes(self) -> int:
        """Client episodes started and not ended."""
        return len(self._registry.episodes)

    def pool(self, **pool_kwargs: Any) -> AsyncEnvPool:
        """An :class:`~aenvs.AsyncEnvPool` of this server's slots, on the inline executor.

        ``pool_kwargs`` go to the pool (``step_timeout``, ``reset_timeout``, ``stack``...);
        an ``executor`` other than ``"inline"`` is refused with a ValueError.
        """
        from aenvs._pool import AsyncEnvPool

        executor = pool_kwargs.pop("executor", "inline")
        if executor != "inline" and getattr(executor, "name", None) != "inline":
            raise ValueError(f"executor={executor!r}: {_INLINE_ONLY}")
        return AsyncEnvPool(self.env_fns, executor=executor, **pool_kwargs)

    async def start(self) -> Self:
        """Start listening. Called by ``async with``; idempotent."""
        if self._closed:
            raise RuntimeError("this EnvServer is closed; serve() a new one")
        if self._server is None:
            self._loop = asyncio.get_running_loop()
            self._server = await _listen(
                self._handle,
                self.host,
                self._port,
                process_request=self._gate,
                ssl=self._ssl,
                compression=None,
                max_size=self._max_size,
            )
        return self

    async def aclose(self) -> None:
        """Close every connection (clients get a PolicyServerError) and stop listening. Idempotent.

        Episodes running in env slots end truncated; slots waiting for an episode get an
        error from their reset.
        """
        self._closed = True
        self._registry.queue.close("the EnvServer closed")
        server, self._server = self._server, None
        if server is not None:
            server.close(close_connections=True, reason="the EnvServer closed")
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"at {self.url}" if self._server is not None else "not started"
        return f"EnvServer(num_envs={self.num_envs}, {state})"

    async def _handle(self, ws: ServerConnection) -> None:
        connection = Connection(ws, self._registry, self._limits)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)


def _serve_tls(context: SSLContext) -> None:
    """Check a server's TLS context, and turn its TLS 1.3 session tickets off.

    The clients never resume a session, and a ticket arriving right after the handshake is
    read by the synchronous client's reader thread while its caller writes the opening
    request: OpenSSL does not allow the two at once on one connection (a rare "[SSL] internal
    error" on connecting).
    """
    if not isinstance(cast(object, context), SSLContext):
        raise TypeError(f"ssl must be an ssl.SSLContext or None, got {type(context).__name__}")
    if context.protocol == PROTOCOL_TLS_CLIENT:
        raise ValueError(
            "ssl is a client context: a server's is ssl.create_default_context(ssl.Purpose.CLIENT_AUTH) "
            "with load_cert_chain(certfile, keyfile)"
        )
    with contextlib.suppress(ValueError):  # a context of the old generic protocol keeps its tickets
        context.num_tickets = 0


_INLINE_ONLY = (
    "the envs of an EnvServer are coroutines on the server's event loop, which only the inline executor runs"
)


def serve(
    num_envs: int,
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    ssl: SSLContext | None = None,
    insecure: bool = False,
    max_message_size: int = MAX_MESSAGE_SIZE,
    max_episodes_per_connection: int | None = MAX_EPISODES_PER_CONNECTION,
    max_messages_per_second: float | None = None,
    idle_timeout: float | None = None,
) -> EnvServer:
    """A server for simulators that connect in; start it with ``async with``.

    Clients that break the protocol or go over a limit get an error message and their
    connection closes (1008); the server, the pool and the other clients carry on.

    Args:
        num_envs: env slots of its pool: client episodes running at once (more queue).
        observation_space: the gymnasium space of the clients' observations.
        action_space: the gymnasium space of the actions they get.
        host: the interface to listen on: loopback by default; ``"0.0.0.0"`` (every
            interface) or an address of the machine to let other machines in, which needs
            a ``token`` (or ``insecure=True``).
        port: the port, or 0 to pick a free one (see :attr:`EnvServer.url`).
        token: a shared secret every client must send (``Authorization: Bearer <token>`` in
            the websocket handshake; the aenvs clients take the same ``token=``); checked once
            per connection in constant time, a client without it or with another is refused
            with HTTP 401 before its connection opens. None: the ``AENVS_SERVE_TOKEN``
            environment variable's, if set (so that it stays out of scripts), else none.
        ssl: an :class:`ssl.SSLContext` with the server's certificate and key
            (``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)``, then
            ``load_cert_chain``): clients connect with ``wss://`` (and the token travels
            encrypted). The server turns its TLS 1.3 session tickets off (``num_tickets =
            0``): the clients never resume a session.
        insecure: serve a non-loopback ``host`` without a token (anyone who reaches the
            port can start episodes and read actions); refused unless set.
        max_message_size: bytes a message may hold; a larger one closes its connection (1009).
        max_episodes_per_connection: episodes a connection may have open at once (None:
            no limit).
        max_messages_per_second: messages a connection may send a second, in bursts of up to
            a second's worth (None: no limit).
        idle_timeout: seconds a connection may stay silent (nothing either way) while none of
            its episodes waits for an action (None: no limit; the websocket pings still find
            vanished peers within about 40 s).

    Example:
        >>> from gymnasium import spaces
        >>> import aenvs
        >>> aenvs.serve(4, spaces.Text(100), spaces.Text(100))
        EnvServer(num_envs=4, not started)
        >>> aenvs.serve(4, spaces.Text(100), spaces.Text(100), host="0.0.0.0", token="s3cret-Ahx8").requires_token
        True
    """
    return EnvServer(
        num_envs,
        observation_space,
        action_space,
        host=host,
        port=port,
        token=token,
        ssl=ssl,
        insecure=insecure,
        max_message_size=max_message_size,
        max_episodes_per_connection=max_episodes_per_connection,
        max_messages_per_second=max_messages_per_second,
        idle_timeout=idle_timeout,
    )

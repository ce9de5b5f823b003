"""The wire protocol between an :class:`~aenvs.EnvServer` and its policy clients.

A client opens a websocket to the server (``ws://``, or ``wss://`` for a server with TLS).
A server with a token accepts only an opening request with the header ``Authorization:
Bearer <token>``; it answers any other with HTTP 401 and a line saying why, and the
connection never opens.

Every message is one websocket text frame holding a JSON object with a ``"type"``.
Client to server (none is answered except ``get_action``, so a client never waits for
anything but its actions):

- ``{"type": "start_episode", "episode_id": str}``
- ``{"type": "get_action", "episode_id": str, "observation": value}``, answered by
  ``{"type": "action", "episode_id": str, "action": value}``
- ``{"type": "log_returns", "episode_id": str, "reward": number, "info": object | null}``
- ``{"type": "end_episode", "episode_id": str, "observation": value, "truncated": bool}``

Server to client, besides actions: ``{"type": "episode_aborted", "episode_id": str,
"reason": str}`` when the trainer gave an episode up (its pool reset it or closed, or a
step outlived ``step_timeout``), and ``{"type": "error", "message": str}`` before the
server closes a connection (close code 1008) that broke the protocol or went over one of
the server's limits (episodes open at once, messages a second, idle time). The websocket
layer itself closes a connection that sends a message larger than the server's
``max_message_size`` (1009) or a text frame that is not UTF-8 (1007).

A value (observation or action) is one sample of its gymnasium space as JSON: what the
space's ``to_jsonable`` gives for it (numbers, nested lists for arrays, strings), a JSON
object for a ``Dict`` space and a list for a ``Tuple`` space. Nothing is ever pickled. An
``info`` nests at most :data:`MAX_INFO_DEPTH` objects and lists, and its integers fit in
64 bits (it becomes tensors and tensordict entries).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from aenvs._errors import AenvsError

__all__ = [
    "MAX_INFO_DEPTH",
    "MAX_MESSAGE_SIZE",
    "PolicyServerError",
    "ProtocolError",
    "brief",
    "check_info",
    "decode",
    "dumps",
    "encode",
    "fits",
    "loads",
    "plain_json",
]

MAX_MESSAGE_SIZE = 2**24
"""Bytes a message may hold by default, each way (text observations can be long)."""

MAX_INFO_DEPTH = 32
"""Objects and lists an ``info`` may nest (the pool turns nested objects into nested tensordicts)."""

_INT64 = range(-(2**63), 2**63)


class PolicyServerError(AenvsError):
    """A policy client's call failed: the server refused the client or closed its connection,
    gave the episode up, or went away.

    Example:
        >>> from aenvs import AenvsError, PolicyServerError
        >>> issubclass(PolicyServerError, AenvsError)
        True
    """


class ProtocolError(ValueError):
    """A message a client sent breaks the protocol; the server answers with it and closes."""


Space = spaces.Space[Any]


def _dict_spaces(space: Any) -> dict[str, Space]:
    return cast("dict[str, Space]", space.spaces)


def _tuple_spaces(space: Any) -> tuple[Space, ...]:
    return cast("tuple[Space, ...]", space.spaces)


def encode(space: spaces.Space[Any], value: Any) -> Any:
    """One sample of ``space`` as a JSON-ready value (through the space's ``to_jsonable``).

    Example:
        >>> import numpy as np
        >>> encode(spaces.Box(-1, 1, (2,)), np.array([0.5, -0.5], dtype=np.float32))
        [0.5, -0.5]
        >>> encode(spaces.Dict({"n": spaces.Discrete(3), "s": spaces.Text(5)}), {"n": 2, "s": "hi"})
        {'n': 2, 's': 'hi'}
    """
    if isinstance(space, spaces.Dict):
        return {key: encode(sub, value[key]) for key, sub in _dict_spaces(space).items()}
    if isinstance(space, spaces.Tuple):
        return [encode(sub, item) for sub, item in zip(_tuple_spaces(space), value, strict=True)]
    return space.to_jsonable([value])[0]


def decode(space: spaces.Space[Any], value: Any) -> Any:
    """The sample of ``space`` a JSON value stands for (through the space's ``from_jsonable``).

    Raises ValueError when the value has not the structure the space asks for.

    Example:
        >>> decode(spaces.Box(-1, 1, (2,)), [0.5, -0.5])
        array([ 0.5, -0.5], dtype=float32)
        >>> decode(spaces.Dict({"n": spaces.Discrete(3)}), {"n": 2})
        {'n': np.int64(2)}
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict) or set(cast("dict[str, Any]", value)) != set(_dict_spaces(space)):
            raise ValueError(
                f"expected an object with the keys {sorted(_dict_spaces(space))}, got {brief(value)}"
            )
        items = cast("dict[str, Any]", value)
        return {key: decode(sub, items[key]) for key, sub in _dict_spaces(space).items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, list) or len(cast("list[Any]", value)) != len(_tuple_spaces(space)):
            raise ValueError(f"expected a list of {len(_tuple_spaces(space))} items, got {brief(value)}")
        return tuple(
            decode(sub, item)
            for sub, item in zip(_tuple_spaces(space), cast("list[Any]", value), strict=True)
        )
    try:
        return space.from_jsonable([value])[0]
    except Exception as exc:  # a space's from_jsonable on any JSON value: whatever it raises, it refused it
        raise ValueError(f"{brief(value)} is no sample of {space}: {str(exc)[:160]}") from None


def fits(space: spaces.Space[Any], value: Any) -> bool:
    """Whether a decoded value has the structure of ``space``: shape and dtype for a ``Box``
    (its bounds are not checked, as gymnasium's env checker only warns about them), and
    membership for every other space.

    Example:
        >>> import numpy as np
        >>> box = spaces.Box(-1, 1, (2,))
        >>> fits(box, np.array([5.0, 0.0], dtype=np.float32)), fits(box, np.zeros(3, dtype=np.float32))
        (True, False)
        >>> fits(spaces.Discrete(2), np.int64(2))
        False
    """
    if isinstance(space, spaces.Box):
        array = np.asarray(value)
        return array.shape == space.shape and np.can_cast(array.dtype, cast("Any", space).dtype, "same_kind")
    if isinstance(space, spaces.Dict):
        items = cast("dict[str, Any]", value)
        return all(fits(sub, items[key]) for key, sub in _dict_spaces(space).items())
    if isinstance(space, spaces.Tuple):
        return all(
            fits(sub, item)
            for sub, item in zip(_tuple_spaces(space), cast("tuple[Any, ...]", value), strict=True)
        )
    try:
        return bool(space.contains(value))
    except (TypeError, ValueError, OverflowError):  # a value of a type the space never compares with
        return False


def check_info(info: Any) -> dict[str, Any] | None:
    """An ``info`` a client logged, once checked: an object or null, nesting at most
    :data:`MAX_INFO_DEPTH` objects and lists, its integers within 64 bits.

    Raises ProtocolError naming what is wrong.

    Example:
        >>> check_info({"score": 3, "tags": ["a", "b"]})
        {'score': 3, 'tags': ['a', 'b']}
        >>> check_info({"score": 2**70})
        Traceback (most recent call last):
        ...
        aenvs._serving.protocol.ProtocolError: log_returns: "info" holds the integer 1180591620717411303424, beyond 64 bits
    """
    if info is None:
        return None
    if not isinstance(info, dict):
        raise ProtocolError(f'log_returns: "info" must be an object or null, got {brief(info)}')
    stack: list[tuple[Any, int]] = [(info, 1)]
    while stack:  # no recursion: a deeply nested info must not exhaust the stack
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_INFO_DEPTH:
                raise ProtocolError(f'log_returns: "info" nests more than {MAX_INFO_DEPTH} objects and lists')
            items = (
                cast("dict[str, Any]", item).values() if isinstance(item, dict) else cast("list[Any]", item)
            )
            stack.extend((child, depth + 1) for child in items)
        elif isinstance(item, int) and not isinstance(item, bool) and item not in _INT64:
            raise ProtocolError(f'log_returns: "info" holds the integer {brief(item)}, beyond 64 bits')
    return cast("dict[str, Any]", info)


def plain_json(value: Any) -> Any:
    """A value made of numpy arrays and scalars, tuples and dicts, as plain JSON values.

    What a client without the spaces sends: arrays become nested lists, numpy scalars
    Python numbers, tuples lists.

    Example:
        >>> import numpy as np
        >>> plain_json({"x": np.arange(2), "n": np.int64(3), "t": (1.5, "a")})
        {'x': [0, 1], 'n': 3, 't': [1.5, 'a']}
    """
    if isinstance(value, np.ndarray | np.generic):
        return cast("Any", value).tolist()
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in cast("Mapping[Any, Any]", value).items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in cast("list[Any]", value)]
    return value


def dumps(message: Mapping[str, Any]) -> str:
    """One message as the text of a frame."""
    return json.dumps(message, separators=(",", ":"))


def loads(text: str | bytes) -> dict[str, Any]:
    """Parse a frame; raises ProtocolError for anything but a JSON object with a string ``"type"``.

    Example:
        >>> loads('{"type": "action", "episode_id": "e", "action": 1}')["action"]
        1
        >>> loads("[1]")
        Traceback (most recent call last):
        ...
        aenvs._serving.protocol.ProtocolError: a message must be a JSON object with a "type", got [1]
    """
    if isinstance(text, bytes):
        raise ProtocolError("messages are JSON text frames, got a binary frame")
    try:
        message = json.loads(text)
    except RecursionError:
        raise ProtocolError(
            f"a message nests arrays or objects deeper than the JSON parser goes: {text[:80]!r}"
        ) from None
    except ValueError as exc:  # invalid JSON, or an integer longer than Python reads (4,300 digits)
        raise ProtocolError(
            f"a message is not valid JSON ({str(exc).split(';')[0]}): {text[:80]!r}"
        ) from None
    if not isinstance(message, dict) or not isinstance(cast("dict[str, Any]", message).get("type"), str):
        raise ProtocolError(f'a message must be a JSON object with a "type", got {brief(message)}')
    return cast("dict[str, Any]", message)


_REPR = reprlib.Repr()  # bounded in depth and length, whatever a client sent
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 6, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 30, 60


def brief(value: Any) -> str:
    """A short repr of anything a client sent, for error messages (depth and length bounded).

    Example:
        >>> brief([[[[[1]]]]]), brief(10**100), len(brief("x" * 10_000))
        ('[[[[...]]]]', '1000000000000...00000000000000', 60)
    """
    return _REPR.repr(value)

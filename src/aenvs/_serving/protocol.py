"""The wire protocol between an :class:`~aenvs.EnvServer` and its policy clients.

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
server closes a connection that broke the protocol.

A value (observation or action) is one sample of its gymnasium space as JSON: what the
space's ``to_jsonable`` gives for it (numbers, nested lists for arrays, strings), a JSON
object for a ``Dict`` space and a list for a ``Tuple`` space. Nothing is ever pickled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from aenvs._errors import AenvsError

__all__ = [
    "MAX_MESSAGE_SIZE",
    "PolicyServerError",
    "ProtocolError",
    "decode",
    "dumps",
    "encode",
    "fits",
    "loads",
    "plain_json",
]

MAX_MESSAGE_SIZE = 2**24
"""Bytes a message may hold by default, each way (text observations can be long)."""


class PolicyServerError(AenvsError):
    """A policy client's call failed: the server refused a message, gave the episode up, or went away.

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
                f"expected an object with the keys {sorted(_dict_spaces(space))}, got {_short(value)}"
            )
        items = cast("dict[str, Any]", value)
        return {key: decode(sub, items[key]) for key, sub in _dict_spaces(space).items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, list) or len(cast("list[Any]", value)) != len(_tuple_spaces(space)):
            raise ValueError(f"expected a list of {len(_tuple_spaces(space))} items, got {_short(value)}")
        return tuple(
            decode(sub, item)
            for sub, item in zip(_tuple_spaces(space), cast("list[Any]", value), strict=True)
        )
    try:
        return space.from_jsonable([value])[0]
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise ValueError(f"{_short(value)} is no sample of {space}: {exc}") from None


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
    return bool(space.contains(value))


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
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"a message is not valid JSON ({exc}): {text[:80]!r}") from None
    if not isinstance(message, dict) or not isinstance(cast("dict[str, Any]", message).get("type"), str):
        raise ProtocolError(f'a message must be a JSON object with a "type", got {_short(message)}')
    return cast("dict[str, Any]", message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

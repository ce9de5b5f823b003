"""Batches of the spaces without a fixed shape (``Text``, ``Sequence``, ``Graph``, ``OneOf``,
custom spaces), as gymnasium's vector envs batch them: a tuple holding each env's value.

The pool carries these observations as non-tensor entries beside its fixed-shape buffers.
The readers here are built once per space part, and imported (with torch) only by vector
envs that have such parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs._object_actions import values_per_row
from aenvs._specs import Key
from aenvs._tensors import plain_value, td_get

__all__ = ["object_reader"]

# values that the pool never turns into tensors: no per-value conversion on the way back
_KEPT_AS_SENT = (spaces.Text, spaces.Graph, spaces.OneOf)


def object_reader(space: spaces.Space[Any], key: Key) -> Callable[[TensorDictBase], tuple[Any, ...]]:
    """A function taking the batch of ``space`` (no fixed shape) at ``key`` out of a TensorDict:
    a tuple with one value per row, each as the env gave it.

    Numbers and numeric arrays the pool stacked into tensors (a ``Sequence(..., stack=True)``
    whose envs gave arrays of one length, say) come back as numpy arrays of their dtype, and
    mappings of them as dicts.

    Example:
        >>> from tensordict import TensorDict
        >>> td = TensorDict({}, [2])
        >>> td["observation"] = ["hi", "there"]
        >>> object_reader(spaces.Text(8), ("observation",))(td)
        ('hi', 'there')
    """
    name = ".".join(key)
    plain = not isinstance(space, _KEPT_AS_SENT)

    def read(td: TensorDictBase) -> tuple[Any, ...]:
        entry = td_get(td, key)
        if entry is None:
            raise KeyError(f"the pool's results have no {name!r} entry for the space {space}")
        values = values_per_row(entry, td.batch_size[0])
        return tuple(map(plain_value, values)) if plain else tuple(values)

    return read

"""Non-tensor actions: text, token lists, messages... read per env out of a batch and checked.

An action space part without a fixed shape (``Text``, ``Sequence``, ``Graph``, ``OneOf``,
a custom space) is an object leaf (:data:`aenvs._specs.OBJECT`): one Python value per
env. A batch gives them as a non-tensor entry (``td["action"] = ["go north", "look"]``, a
``NonTensorStack``), one value for all (``NonTensorData``), per-env values in a lazy
stack, or a tensor (one row per env). They are read here, checked before anything is
dispatched, and travel with the step command (:class:`~aenvs._commands.Command`).
"""

from __future__ import annotations

import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenvs._specs import EnvSpec, Key, Space, object_spaces, text_contains
from aenvs._tensors import non_tensor_values, td_get

__all__ = ["ObjectActions", "values_per_row"]

ObjectValues = dict[int, dict[Key, Any]]


def _name(key: Key) -> str:
    return ".".join(key)


def values_per_row(value: Any, n: int) -> list[Any]:
    """One value per row of a batch entry ``value`` of ``n`` rows.

    Example:
        >>> from tensordict import NonTensorData
        >>> values_per_row(NonTensorData("look"), 2)
        ['look', 'look']
    """
    if isinstance(value, NonTensorData):
        return [value.data] * n  # one value given for every env
    if isinstance(value, NonTensorStack):
        return non_tensor_values(value)
    if isinstance(value, torch.Tensor):
        return list(value.detach().unbind(0))
    if isinstance(value, TensorDictBase):
        return [cast("Any", row).to_dict() for row in value.unbind(0)]
    return list(cast("Sequence[Any]", value))


class ObjectActions:
    """Reads and checks the non-tensor actions of a pool whose envs have some.

    ``Text`` values are checked against their space (a ``str`` within its length and
    charset), ``Sequence``, ``Graph`` and ``OneOf`` values for their kind (a sequence, a
    ``GraphInstance``, an ``(index, value)`` pair); other spaces' values only for presence:
    their membership tests walk every element (a token list of thousands), and the env
    checks what it receives.

    Example:
        >>> from tensordict import TensorDict
        >>> spec = EnvSpec.from_spaces(spaces.Text(8), spaces.Text(8))
        >>> reader = ObjectActions([spec, spec])
        >>> td = TensorDict({}, [2])
        >>> td["action"] = ["go", "look"]
        >>> reader.read(td, [0, 1])
        {0: {('action',): 'go'}, 1: {('action',): 'look'}}
    """

    def __init__(self, specs: Sequence[EnvSpec]) -> None:
        self._spaces = [object_spaces(spec.action_space, ("action",)) for spec in specs]
        self.present = any(self._spaces)
        # every env's object spaces, where they are the same (the common case): read by column
        first = self._spaces[0] if self._spaces else {}
        self._shared = first if first and all(s == first for s in self._spaces) else None

    def read(
        self, td: TensorDictBase, env_indices: Sequence[int], given: Mapping[Key, Any] | None = None
    ) -> ObjectValues | None:
        """Each env's non-tensor action values by key (None if no env has any); raises
        ValueError / TypeError naming the env and the key for a missing or wrong value.
        ``given``: values by key beside ``td`` (lists of one value per env)."""
        if not self.present:
            return None
        if given is not None:
            td = _WithColumns(td, given)  # pyright: ignore[reportAssignmentType]
        if self._shared is not None:
            read = _read_columns(td, env_indices, self._shared)
            if read is not None:
                return read
        n = len(env_indices)
        columns: dict[Key, list[Any]] = {}
        out: ObjectValues = {}
        for row, i in enumerate(env_indices):
            mine: dict[Key, Any] = {}
            for key, space in self._spaces[i].items():
                column = columns.get(key)
                if column is None:
                    value = td_get(td, key)
                    if value is None:
                        raise ValueError(
                            f"env {i}: the input has no {_name(key)!r} entry; its action space is "
                            f"{self._spaces[i][key]}"
                        )
                    column = columns[key] = values_per_row(value, n)
                    if len(column) != n:
                        raise ValueError(f"env {i}: {_name(key)!r} has {len(column)} values for {n} envs")
                mine[key] = _checked(column[row], space, i, key)
            out[i] = mine
        return out


class _WithColumns:
    """A TensorDict's ``get``, with entries given as columns first (for :func:`td_get`)."""

    def __init__(self, td: TensorDictBase, columns: Mapping[Key, Any]) -> None:
        self._td, self._columns = td, columns

    def get(self, key: Any, default: Any = None) -> Any:
        path = (key,) if isinstance(key, str) else tuple(key)
        value = self._columns.get(path)
        return value if value is not None else td_get(self._td, key, default)


def _read_columns(
    td: TensorDictBase, env_indices: Sequence[int], shared: dict[Key, Space]
) -> ObjectValues | None:
    """:meth:`ObjectActions.read` for envs with the same object spaces, a key at a time; None
    where a value is missing or wrong (the row-by-row read then names the first bad one)."""
    n = len(env_indices)
    out: ObjectValues = {i: {} for i in env_indices}
    for key, space in shared.items():
        value = td_get(td, key)
        if value is None:
            return None
        column = values_per_row(value, n)
        if len(column) != n:
            return None
        if type(space) is spaces.Text:
            low, high, charset = space.min_length, space.max_length, space.character_set
            for v in column:
                if type(v) is not str or not low <= len(v) <= high or not charset.issuperset(v):
                    return None
        else:
            try:
                column = [_checked(v, space, i, key) for v, i in zip(column, env_indices, strict=True)]
            except (ValueError, TypeError):
                return None
        for i, v in zip(env_indices, column, strict=True):
            out[i][key] = v
    return out


def _checked(value: Any, space: Space, env_index: int, key: Key) -> Any:
    if value is None:
        raise ValueError(f"env {env_index}: {_name(key)!r} has no value (None) for the space {space}")
    if isinstance(space, spaces.Text):
        if not isinstance(value, str):
            raise TypeError(
                f"env {env_index}: {_name(key)!r} must be a str for the space {space}, "
                f"got {type(value).__name__}"
            )
        if not text_contains(space, value):
            raise ValueError(
                f"env {env_index}: {_name(key)!r} value {value[:40]!r} is not in {space} "
                f"(length {len(value)}, or a character outside its charset)"
            )
    elif isinstance(space, spaces.Sequence | spaces.Graph | spaces.OneOf):
        expected = _wrong_kind(cast("Space", space), value)
        if expected is not None:
            raise TypeError(
                f"env {env_index}: {_name(key)!r} must be {expected} for the space {space}, "
                f"got {type(value).__name__} {reprlib.repr(value)}"
            )
    return value


def _wrong_kind(space: Space, value: Any) -> str | None:
    """What ``value`` should be for ``space`` (a Sequence, Graph or OneOf), if it is of another
    kind; None if it is of the right kind. Cheap: the elements are the env's to check."""
    if isinstance(space, spaces.Graph):
        return None if isinstance(value, spaces.GraphInstance) else "a GraphInstance"
    if isinstance(space, spaces.OneOf):
        count = len(cast("spaces.OneOf[Any]", space).spaces)
        pair = cast("Sequence[Any]", value) if isinstance(value, tuple | list) else ()
        if len(pair) == 2 and isinstance(pair[0], numbers.Integral) and 0 <= int(pair[0]) < count:
            return None
        return f"an (index, value) pair, index below {count}"
    if isinstance(value, str | bytes):
        return "a sequence of its elements (a tuple)"
    if isinstance(value, Mapping):  # a stacked Sequence of a Dict space samples a dict
        sequence = cast(Any, space)  # gymnasium's Sequence: its attributes are untyped
        stacked: bool = sequence.stack
        feature: Space = sequence.feature_space
        return None if stacked and isinstance(feature, spaces.Dict) else "a sequence of its elements"
    if isinstance(value, Sequence | np.ndarray | torch.Tensor):
        return None
    return "a sequence of its elements (a tuple)"

"""Non-tensor actions: text, token lists, messages... read per env out of a batch and checked.

An action space part without a fixed shape (``Text``, ``Sequence``, ``Graph``, ``OneOf``,
a custom space) is an object leaf (:data:`aenvs._specs.OBJECT`): one Python value per
env. A batch gives them as a non-tensor entry (``td["action"] = ["go north", "look"]``, a
``NonTensorStack``), one value for all (``NonTensorData``), per-env values in a lazy
stack, or a tensor (one row per env). They are read here, checked before anything is
dispatched, and travel with the step command (:class:`~aenvs._commands.Command`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from gymnasium import spaces
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenvs._specs import EnvSpec, Key, Space
from aenvs._tensors import td_get

__all__ = ["ObjectActions", "object_action_spaces", "values_per_row"]

ObjectValues = dict[int, dict[Key, Any]]


def object_action_spaces(space: Space, path: Key = ("action",)) -> dict[Key, Space]:
    """The parts of an action space that have no fixed shape, by the key their values use.

    Example:
        >>> space = spaces.Dict({"say": spaces.Text(16), "move": spaces.Discrete(4)})
        >>> object_action_spaces(space)
        {('action', 'say'): Text(1, 16, charset=...)}
    """
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
        return {}
    if isinstance(space, spaces.Dict):
        parts = cast("spaces.Dict[Any]", space)
        found: dict[Key, Space] = {}
        for name in parts:
            found.update(object_action_spaces(parts[name], (*path, name)))
        return found
    if isinstance(space, spaces.Tuple):
        items = cast("spaces.Tuple[Any]", space)
        found = {}
        for i in range(len(items)):
            found.update(object_action_spaces(items[i], (*path, str(i))))
        return found
    return {path: space}


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
        return list(value.tolist())
    if isinstance(value, torch.Tensor):
        return list(value.detach().unbind(0))
    if isinstance(value, TensorDictBase):
        return [cast("Any", row).to_dict() for row in value.unbind(0)]
    return list(cast("Sequence[Any]", value))


class ObjectActions:
    """Reads and checks the non-tensor actions of a pool whose envs have some.

    ``Text`` values are checked against their space (a ``str`` within its length and
    charset); other spaces' values only for presence: their membership tests walk every
    element (a token list of thousands), and the env checks what it receives.

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
        self._spaces = [object_action_spaces(spec.action_space) for spec in specs]
        self.present = any(self._spaces)

    def read(self, td: TensorDictBase, env_indices: Sequence[int]) -> ObjectValues | None:
        """Each env's non-tensor action values by key (None if no env has any); raises
        ValueError / TypeError naming the env and the key for a missing or wrong value."""
        if not self.present:
            return None
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


def _checked(value: Any, space: Space, env_index: int, key: Key) -> Any:
    if value is None:
        raise ValueError(f"env {env_index}: {_name(key)!r} has no value (None) for the space {space}")
    if isinstance(space, spaces.Text):
        if not isinstance(value, str):
            raise TypeError(
                f"env {env_index}: {_name(key)!r} must be a str for the space {space}, "
                f"got {type(value).__name__}"
            )
        if not space.contains(value):
            raise ValueError(
                f"env {env_index}: {_name(key)!r} value {value[:40]!r} is not in {space} "
                f"(length {len(value)}, or a character outside its charset)"
            )
    return value

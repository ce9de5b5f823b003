"""numpy batches <-> the pool's TensorDicts, as gymnasium's vector envs batch them: the
observation reader and the action writer of a vector env.

The readers and writers are built once per vector env, for its spaces, so that a step
only runs the closures, with no dispatch on the space.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from gymnasium import spaces

from aenvs._specs import Key
from aenvs._vector.spaces import dict_parts, is_array_space, tuple_parts

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = [
    "ActionWriter",
    "NotABatch",
    "Reader",
    "action_writer",
    "column_reader",
    "obs_reader",
    "tree_reader",
]

ActionWriter = Callable[[Any, dict[str, Any]], None]


Reader = Callable[[Any], Any]
"""Takes a batch (or a part of it) out of the pool's results."""


def tree_reader(
    space: spaces.Space[Any], path: Key, leaf: Callable[[spaces.Space[Any], Key], Reader | None]
) -> Reader | None:
    """A function taking the batch of ``space`` out of the pool's results, as gymnasium
    batches it: a dict for a Dict space, a tuple for a Tuple, and ``leaf(part, key)``'s
    reader for every other part; None if ``leaf`` gives None for some part."""
    if (items := dict_parts(space)) is not None:
        parts = [(k, tree_reader(sub, (*path, k), leaf)) for k, sub in items]
        found = [(k, read) for k, read in parts if read is not None]
        return None if len(found) < len(parts) else lambda batch: {k: read(batch) for k, read in found}
    if (subs := tuple_parts(space)) is not None:
        readers = [tree_reader(sub, (*path, str(i)), leaf) for i, sub in enumerate(subs)]
        found_parts = [read for read in readers if read is not None]
        return (
            None
            if len(found_parts) < len(readers)
            else lambda batch: tuple(read(batch) for read in found_parts)
        )
    return leaf(space, path)


def obs_reader(space: spaces.Space[Any], path: Key) -> Callable[[TensorDictBase], Any]:
    """A function taking the batch of ``space`` out of a TensorDict, as gymnasium batches it:
    arrays for fixed-shape parts, a tuple of each env's value for the others.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> read = obs_reader(spaces.Dict({"a": spaces.Discrete(3)}), ("observation",))
        >>> read(TensorDict({"observation": {"a": torch.tensor([2, 0])}}, [2]))
        {'a': array([2, 0])}
    """
    read = tree_reader(space, path, _td_leaf)
    assert read is not None  # every part has a reader
    return read


def column_reader(space: spaces.Space[Any], path: Key, columns: Collection[Key]) -> Reader | None:
    """A function taking the batch of ``space`` out of step results as columns (arrays or
    tensors by key), as gymnasium batches it; None unless every part of ``space`` is an
    array whose key is among ``columns``.

    Example:
        >>> read = column_reader(spaces.Dict({"a": spaces.Discrete(3)}), (), [("a",)])
        >>> read({("a",): np.array([2, 0])})
        {'a': array([2, 0])}
    """

    def leaf(part: spaces.Space[Any], key: Key) -> Reader | None:
        if not is_array_space(part) or key not in columns:
            return None
        dtype = np.dtype(part.dtype) if part.dtype is not None else None
        return lambda cols: np.asarray(cols[key]).astype(dtype, copy=False)

    return tree_reader(space, path, leaf)


def _td_leaf(space: spaces.Space[Any], path: Key) -> Reader:
    if not is_array_space(space):  # a non-tensor entry: a tuple of the envs' values
        from aenvs._vector.values import object_reader

        return object_reader(space, path)
    dtype = np.dtype(space.dtype) if space.dtype is not None else None
    key = path[0] if len(path) == 1 else path
    return lambda td: td[key].numpy().astype(dtype, copy=False)


class NotABatch(Exception):
    """Raised by an action writer given what is not a batch of its space; a TypeError for the caller."""

    def __init__(self, label: str, expected: str, value: Any, single: bool) -> None:
        super().__init__(label, expected)
        what = f"the single {type(value).__name__}" if single else f"a {type(value).__name__}"
        self.label, self.expected, self.got = label, expected, f"got {what} {reprlib.repr(value)}"

    def describe(self, who: str, n: int, space: spaces.Space[Any]) -> str:
        """The TypeError's message: ``who`` (the method) takes a batch of ``n`` actions of ``space``."""
        if self.label == "actions":
            return f"{who} takes a batch of {n} actions of {space} ({self.expected}), {self.got}"
        return (
            f"{who} takes a batch of {n} actions of {space}: {self.label} must be {self.expected}, {self.got}"
        )


def action_writer(space: spaces.Space[Any], path: Key, n: int) -> ActionWriter:
    """A function writing a batch of ``n`` actions of ``space`` (numpy) into a nested dict of tensors.

    A part without a fixed shape (``Text``, ``Sequence``, ``Graph``, ``OneOf``, a custom
    space) takes any iterable of ``n`` values (a tuple, as its batched space samples it) and
    becomes a non-tensor entry with one value per env. It raises :class:`NotABatch` for a
    single value where a batch is due, ValueError for a batch of the wrong shape or length.

    Example:
        >>> out = {}
        >>> action_writer(spaces.Discrete(3), ("action",), 2)(np.array([2, 0]), out)
        >>> out
        {'action': tensor([2, 0])}
    """
    label = ".".join(("actions", *path[1:]))
    if (items := dict_parts(space)) is not None:
        parts = [(k, action_writer(sub, (*path, k), n)) for k, sub in items]

        def write_dict(actions: Any, out: dict[str, Any]) -> None:
            if not isinstance(actions, Mapping):
                raise NotABatch(label, "a dict of batches, one per key of the space", actions, False)
            node = out.setdefault(path[-1], {})
            for k, write in parts:
                write(actions[k], node)

        return write_dict
    if (subs := tuple_parts(space)) is not None:
        writers = [action_writer(sub, (*path, str(i)), n) for i, sub in enumerate(subs)]

        def write_tuple(actions: Any, out: dict[str, Any]) -> None:
            if not isinstance(actions, tuple | list):
                raise NotABatch(label, f"a tuple of {len(writers)} batches", actions, False)
            batches = cast("tuple[Any, ...] | list[Any]", actions)
            if len(batches) != len(writers):
                raise ValueError(f"{label} have {len(batches)} parts, expected {len(writers)} for {space}")
            node = out.setdefault(path[-1], {})
            for part, write in zip(batches, writers, strict=True):
                write(part, node)

        return write_tuple
    if not is_array_space(space):
        return _object_writer(space, path[-1], n, label)
    from aenvs._tensors import from_numpy

    # Discrete and MultiDiscrete actions travel as int64, MultiBinary as int8, Box as its dtype
    dtype = np.dtype(
        np.int64
        if isinstance(space, spaces.Discrete | spaces.MultiDiscrete)
        else np.int8
        if isinstance(space, spaces.MultiBinary)
        else space.dtype
    )
    name, shape = path[-1], (n, *(space.shape or ()))

    def write_leaf(actions: Any, out: dict[str, Any]) -> None:
        array = np.asarray(actions, dtype=dtype)
        if array.ndim == 0:  # gymnasium's vector envs raise TypeError too: a batch must be iterable
            raise NotABatch(label, f"an array of shape {shape}", actions, True)
        if array.shape != shape:
            raise ValueError(
                f"{label} have shape {array.shape}, expected {shape} for a batch of {n} actions of {space}"
            )
        array = np.ascontiguousarray(array)
        if not array.flags.writeable:  # torch warns on read-only arrays
            array = array.copy()
        out[name] = from_numpy(array)

    return write_leaf


def _object_writer(space: spaces.Space[Any], name: str, n: int, label: str) -> ActionWriter:
    """The writer of a part without a fixed shape: each env's value in a non-tensor entry."""
    from aenvs._tensors import non_tensor_stack

    expected = f"a tuple of {n} values, one per env"

    def write_objects(actions: Any, out: dict[str, Any]) -> None:
        if isinstance(actions, str | bytes) or not isinstance(actions, Iterable) or _is_scalar(actions):
            raise NotABatch(label, expected, actions, True)
        if isinstance(actions, Mapping):  # iterating would give its keys
            raise NotABatch(label, expected, actions, False)
        values = list(cast("Iterable[Any]", actions))
        if len(values) != n:
            raise ValueError(f"{label} have {len(values)} values, expected {n} (one per env) for {space}")
        out[name] = non_tensor_stack(values)

    return write_objects


def _is_scalar(value: Any) -> bool:
    """A 0-d array or tensor: iterable by type, not by value."""
    return getattr(value, "ndim", None) == 0

"""Gymnasium spaces as fixed-shape leaves: the data layout of every env in a pool.

A *leaf* is one entry of an env's TensorDict: its nested key, its per-env shape and
its dtype. Spaces flatten into leaves (a ``Box`` observation is the leaf
``("observation",)``, a ``Dict`` space gives one leaf per sub-space), and a pool
allocates one buffer per leaf with one row per env. Spaces that have no fixed
shape (``Text``, ``Sequence``, ``Graph``...) give no leaf: their values travel as
non-tensor data.

This module imports no torch, so that worker processes hosting gymnasium envs
stay small.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from gymnasium import spaces

__all__ = [
    "DONE_KEYS",
    "OBJECT",
    "EnvSpec",
    "Leaf",
    "action_leaves",
    "object_spaces",
    "observation_leaves",
    "space_leaves",
    "text_contains",
    "text_spaces",
]

Key = tuple[str, ...]
Space = spaces.Space[Any]
"""Any gymnasium space."""

FLAG_SHAPE = (1,)
DONE_KEYS: tuple[Key, ...] = (("done",), ("terminated",), ("truncated",))
REWARD_KEY: Key = ("reward",)


@dataclass(frozen=True, slots=True)
class Leaf:
    """One entry of an env's data with a row per env: key, per-env shape and dtype.

    A leaf of dtype ``object`` (:data:`OBJECT`, shape ``()``) holds one Python value per
    env: a text or token-list action, or any action whose space has no fixed shape.

    Example:
        >>> Leaf(("observation",), (4,), np.dtype("float32")).key
        ('observation',)
    """

    key: Key
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def is_object(self) -> bool:
        """Whether the leaf holds Python values (non-tensor data) rather than numbers."""
        return self.dtype == OBJECT

    def describe(self) -> str:
        if self.is_object:
            return "non-tensor values"
        return f"shape {tuple(self.shape)} and dtype {self.dtype}"


OBJECT = np.dtype(object)


def space_leaves(space: Space, path: Key, objects: bool = False) -> list[Leaf]:
    """Flatten a gymnasium space into the leaves it stores at ``path``: fixed-shape ones,
    and (``objects``) an object leaf for each part without a fixed shape (``Text``,
    ``Sequence``, ``Graph``, ``OneOf``, custom spaces), which otherwise gives none.

    Example:
        >>> space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "n": spaces.Discrete(3)})
        >>> [leaf.key for leaf in space_leaves(space, ())]
        [('n',), ('pos',)]
        >>> [leaf.is_object for leaf in space_leaves(spaces.Text(8), ("action",), objects=True)]
        [True]
    """
    if isinstance(space, spaces.Box):
        return [Leaf(path, tuple(space.shape), np.dtype(cast("spaces.Box[Any]", space).dtype))]
    if isinstance(space, spaces.Discrete):
        return [Leaf(path, (), np.dtype(np.int64))]
    if isinstance(space, spaces.MultiDiscrete):
        return [Leaf(path, tuple(space.shape), np.dtype(np.int64))]
    if isinstance(space, spaces.MultiBinary):
        return [Leaf(path, tuple(space.shape), np.dtype(np.int8))]
    if isinstance(space, spaces.Dict):
        return [
            leaf
            for k, sub in cast("spaces.Dict[Any]", space).spaces.items()
            for leaf in space_leaves(sub, (*path, k), objects)
        ]
    if isinstance(space, spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(cast("spaces.Tuple[Any]", space).spaces)
            for leaf in space_leaves(sub, (*path, str(i)), objects)
        ]
    # no fixed shape: observations carry it as non-tensor data beside the buffers, actions
    # in an object leaf (one Python value per env)
    return [Leaf(path, (), OBJECT)] if objects else []


def object_spaces(space: Space, path: Key) -> dict[Key, Space]:
    """The parts of ``space`` without a fixed shape, by the key their values use under ``path``.

    Example:
        >>> space = spaces.Dict({"say": spaces.Text(16), "move": spaces.Discrete(4)})
        >>> object_spaces(space, ("action",))
        {('action', 'say'): Text(1, 16, charset=...)}
    """
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
        return {}
    if isinstance(space, spaces.Dict):
        parts = cast("spaces.Dict[Any]", space)
        found: dict[Key, Space] = {}
        for name in parts:
            found.update(object_spaces(parts[name], (*path, name)))
        return found
    if isinstance(space, spaces.Tuple):
        items = cast("spaces.Tuple[Any]", space)
        found = {}
        for i in range(len(items)):
            found.update(object_spaces(items[i], (*path, str(i))))
        return found
    return {path: space}


def text_spaces(observation_space: Space) -> dict[Key, spaces.Text]:
    """The ``Text`` parts of an observation space, by the key of their values.

    Example:
        >>> text_spaces(spaces.Dict({"say": spaces.Text(16), "pos": spaces.Box(-1, 1)}))
        {('say',): Text(1, 16, charset=...)}
    """
    found = object_spaces(observation_space, observation_root(observation_space))
    return {key: space for key, space in found.items() if isinstance(space, spaces.Text)}


def text_contains(space: spaces.Text, value: str) -> bool:
    """``space.contains(value)`` for a str: a plain ``Text`` space's charset is tested as one
    set operation, not character by character (a long text costs microseconds, not tens).

    Example:
        >>> text_contains(spaces.Text(4), "ab"), text_contains(spaces.Text(4), "a b")
        (True, False)
    """
    if type(space) is not spaces.Text:
        return space.contains(value)
    return space.min_length <= len(value) <= space.max_length and space.character_set.issuperset(value)


def observation_root(space: Space) -> Key:
    """Where an observation space's values live: a Dict at the root, the rest under "observation"."""
    return () if isinstance(space, spaces.Dict) else ("observation",)


def observation_leaves(space: Space) -> list[Leaf]:
    return space_leaves(space, observation_root(space))


def action_leaves(space: Space) -> list[Leaf]:
    return space_leaves(space, ("action",), objects=True)


def flatten_value(space: Space, value: Any, path: Key) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, value)`` for every part of ``value`` laid out as ``space`` says."""
    if isinstance(space, spaces.Dict):
        for k, sub in cast("spaces.Dict[Any]", space).spaces.items():
            yield from flatten_value(sub, value[k], (*path, k))
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(cast("spaces.Tuple[Any]", space).spaces):
            yield from flatten_value(sub, value[i], (*path, str(i)))
    else:
        yield path, value


def value_flattener(space: Space, path: Key) -> Callable[[Any], list[tuple[Key, Any]]]:
    """:func:`flatten_value` for ``space``, built once: a function from a value to its
    ``(key, value)`` parts, without walking the space at every call.

    Example:
        >>> space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "n": spaces.Discrete(3)})
        >>> value_flattener(space, ())({"pos": 0.5, "n": 2})
        [(('n',), 2), (('pos',), 0.5)]
    """
    routes: list[tuple[Key, tuple[str | int, ...]]] = []

    def walk(sub: Space, key: Key, route: tuple[str | int, ...]) -> None:
        if isinstance(sub, spaces.Dict):
            for k, inner in cast("spaces.Dict[Any]", sub).spaces.items():
                walk(inner, (*key, k), (*route, k))
        elif isinstance(sub, spaces.Tuple):
            for i, inner in enumerate(cast("spaces.Tuple[Any]", sub).spaces):
                walk(inner, (*key, str(i)), (*route, i))
        else:
            routes.append((key, route))

    walk(space, path, ())
    if len(routes) > 1 and all(len(route) == 1 for _, route in routes):
        # one level, a Dict or Tuple of leaves (the usual case): one C-level getter for all
        keys = [key for key, _ in routes]
        get_parts = operator.itemgetter(*(route[0] for _, route in routes))
        return lambda value: list(zip(keys, get_parts(value), strict=True))

    def flatten(value: Any) -> list[tuple[Key, Any]]:
        parts: list[tuple[Key, Any]] = []
        for key, route in routes:
            part = value
            for step in route:
                part = part[step]
            parts.append((key, part))
        return parts

    return flatten


def action_reader(
    space: Space, buffers: Mapping[Key, np.ndarray], path: Key = ("action",)
) -> Callable[[int], Any]:
    """A function reading one env's action out of per-leaf buffers, as ``space`` expects it.

    Built once per env, so that a step pays no dispatch on the space's type. ``Discrete``
    and ``MultiDiscrete`` actions are stored as int64 whatever their space's dtype; the
    env gets them back in that dtype (a ``Discrete`` action as the dtype's numpy scalar,
    as gymnasium's vector envs hand them over), so that ``action in env.action_space`` holds. A value the dtype cannot hold
    stays int64 (the env's own check then refuses it) instead of wrapping around into
    another, valid-looking action.

    Example:
        >>> read = action_reader(spaces.Discrete(3), {("action",): np.array([2, 0])})
        >>> read(0)
        np.int64(2)
        >>> read = action_reader(spaces.Discrete(3, dtype=np.int8), {("action",): np.array([2, 0])})
        >>> read(0)
        np.int8(2)
    """
    if isinstance(space, spaces.Dict):
        parts = {
            k: action_reader(sub, buffers, (*path, k))
            for k, sub in cast("spaces.Dict[Any]", space).spaces.items()
        }
        return lambda row: {k: read(row) for k, read in parts.items()}
    if isinstance(space, spaces.Tuple):
        items = [
            action_reader(sub, buffers, (*path, str(i)))
            for i, sub in enumerate(cast("spaces.Tuple[Any]", space).spaces)
        ]
        return lambda row: tuple(read(row) for read in items)
    buf = buffers[path]
    if buf.dtype == OBJECT:  # the env's own value, as sent (text, token ids, a message...)
        return lambda row: buf[row]
    if isinstance(space, spaces.Discrete | spaces.MultiDiscrete):
        dtype: np.dtype[Any] = cast("spaces.Discrete[Any] | spaces.MultiDiscrete[Any]", space).dtype
        if dtype != buf.dtype:
            return _integer_reader(buf, dtype, isinstance(space, spaces.Discrete))
    if isinstance(space, spaces.Discrete):
        return buf.__getitem__  # a numpy int64 scalar, as gymnasium's vector envs hand it over
    # a copy: the row is overwritten by the next send, and envs may keep what they get
    return lambda row: buf[row].copy()


def _integer_reader(buf: np.ndarray, dtype: np.dtype, scalar: bool) -> Callable[[int], Any]:
    """Read a row of int64 ``buf`` as ``dtype`` (a numpy scalar if ``scalar``), if it fits."""
    info = np.iinfo(dtype)
    low, high = int(info.min), int(info.max)
    if scalar:
        to_scalar = dtype.type

        def read_scalar(row: int) -> Any:
            value = buf[row]
            return to_scalar(value) if low <= value <= high else value

        return read_scalar

    def read_array(row: int) -> np.ndarray:
        values = buf[row]
        if values.size and (values.min() < low or values.max() > high):
            return values.copy()
        return values.astype(dtype)  # a new array: envs may keep what they get

    return read_array


def _flag_leaves() -> list[Leaf]:
    return [Leaf(k, FLAG_SHAPE, np.dtype(bool)) for k in DONE_KEYS]


@dataclass(frozen=True)
class EnvSpec:
    """What one env looks like from outside: its spaces and the leaves they flatten to.

    Attributes:
        observation_space, action_space, reward_space: gymnasium spaces.
        reset_leaves: fixed-shape entries of a reset result (observations and flags).
        step_leaves: fixed-shape entries of a step result (observations, reward, flags).
        action_leaves: fixed-shape entries a step takes.
        batch_shape: the env's own batch shape (a TorchRL env of batch size ``[3]``), ``()``
            for one env: every leaf's shape starts with it, the spaces describe one sub-env.
        action_root: where the action space's values live in a step's input: ``("action",)``,
            or ``()`` for a multi-agent env, whose groups hold their own ``"action"`` entries.

    Example:
        >>> from gymnasium import spaces
        >>> from aenvs import EnvSpec
        >>> spec = EnvSpec.from_spaces(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
        >>> [leaf.key for leaf in spec.step_leaves]
        [('observation',), ('reward',), ('done',), ('terminated',), ('truncated',)]
    """

    observation_space: Space
    action_space: Space
    reward_space: Space = field(default_factory=lambda: spaces.Box(-np.inf, np.inf, FLAG_SHAPE, np.float32))
    reset_leaves: tuple[Leaf, ...] = ()
    step_leaves: tuple[Leaf, ...] = ()
    action_leaves: tuple[Leaf, ...] = ()
    batch_shape: tuple[int, ...] = ()
    action_root: Key = ("action",)

    @classmethod
    def from_spaces(
        cls,
        observation_space: Space,
        action_space: Space,
        reward_space: Space | None = None,
        batch_shape: tuple[int, ...] = (),
        action_root: Key = ("action",),
    ) -> EnvSpec:
        """The spec of an env with these spaces, its leaves flattened from them.

        A reset gives the observation leaves and the done / terminated / truncated flags
        (bool, shape ``(1,)``); a step gives those plus ``"reward"`` (float32, shape
        ``(1,)``), and takes the action leaves under ``"action"``. ``reward_space`` (by
        default an unbounded float32 ``Box`` of shape ``(1,)``) is kept for checks. ``batch_shape`` (the env's own
        batch; the spaces are one sub-env's) goes in front of every leaf's shape. ``action_root``:
        where the action leaves go (``()`` for a multi-agent env's per-group actions).

        Example:
            >>> from gymnasium import spaces
            >>> spec = EnvSpec.from_spaces(
            ...     spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "hit": spaces.MultiBinary(3)}),
            ...     spaces.Discrete(4),
            ... )
            >>> [(leaf.key, leaf.shape, str(leaf.dtype)) for leaf in spec.reset_leaves[:2]]
            [(('hit',), (3,), 'int8'), (('pos',), (2,), 'float32')]
            >>> [(leaf.key, leaf.shape, str(leaf.dtype)) for leaf in spec.action_leaves]
            [(('action',), (), 'int64')]
        """
        reward_space = reward_space or spaces.Box(-np.inf, np.inf, FLAG_SHAPE, np.float32)
        obs = observation_leaves(observation_space)
        reward = Leaf(REWARD_KEY, FLAG_SHAPE, np.dtype(np.float32))
        reset, step = (*obs, *_flag_leaves()), (*obs, reward, *_flag_leaves())
        actions = tuple(space_leaves(action_space, action_root, objects=True))
        if batch_shape:
            reset, step, actions = (
                tuple(Leaf(leaf.key, (*batch_shape, *leaf.shape), leaf.dtype) for leaf in leaves)
                for leaves in (reset, step, actions)
            )
        return cls(
            observation_space,
            action_space,
            reward_space,
            reset_leaves=reset,
            step_leaves=step,
            action_leaves=actions,
            batch_shape=tuple(batch_shape),
            action_root=tuple(action_root),
        )

    @property
    def observation_keys(self) -> tuple[Key, ...]:
        return tuple(leaf.key for leaf in observation_leaves(self.observation_space))

    @property
    def layout(self) -> tuple[tuple[Leaf, ...], tuple[Leaf, ...]]:
        """What must agree between envs for their data to stack densely."""
        return self.step_leaves, self.action_leaves

    def layout_difference(self, other: EnvSpec) -> str | None:
        """Name the first key whose shape or dtype differs from ``other``, or None."""
        mine = {leaf.key: leaf for leaf in (*self.step_leaves, *self.action_leaves)}
        theirs = {leaf.key: leaf for leaf in (*other.step_leaves, *other.action_leaves)}
        for key in sorted(mine.keys() | theirs.keys()):
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None:
                return f"key {'.'.join(key)!r} is missing in one of them"
            if a != b:
                return f"key {'.'.join(key)!r} has {a.describe()} against {b.describe()}"
        return None

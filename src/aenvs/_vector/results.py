"""Gymnasium's step and reset returns, out of the pool's TensorDicts.

:class:`Results` keeps a vector env's observations between calls (a ``reset_mask`` reset
replaces only some rows), which envs ended their episode, and merges what the members
carried beside the pool's layout (infos, float64 rewards) into vector infos.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from copy import deepcopy
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

from aenvs._adapters.autoreset import Carry
from aenvs._specs import Key, observation_root
from aenvs._vector.conversion import column_reader, obs_reader
from aenvs._vector.spaces import dict_parts, is_array_space, tuple_parts

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = [
    "AddInfo",
    "Results",
    "StepReturn",
    "carries_of",
    "read_carries",
    "tree_copy",
    "tree_set_rows",
]

AddInfo = Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]
"""``VectorEnv._add_info``: adds env ``i``'s info to vector infos, returns them."""

StepReturn = tuple[
    Any, "npt.NDArray[np.float64]", "npt.NDArray[np.bool_]", "npt.NDArray[np.bool_]", dict[str, Any]
]
"""``(observations, rewards, terminations, truncations, infos)``, as ``VectorEnv.step`` returns them."""

_REWARD, _TERMINATED, _TRUNCATED, _INFO = ("reward",), ("terminated",), ("truncated",), ("info",)


class Results:
    """The returns of one vector env's steps and resets, built from the pool's TensorDicts.

    Args:
        observation_space: each env's observation space.
        num_envs: how many envs.
        add_info: the vector env's ``_add_info``.
        columns: the keys of the fixed-shape entries of a step result (the pool's
            ``step_leaves``): where :meth:`step_columns` finds the observations.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> results = Results(spaces.Discrete(3), 2, add_info=lambda infos, info, i: infos)
        >>> results.reset(TensorDict({"observation": torch.tensor([1])}, [1]), [1], copy=True)
        (array([0, 1]), {})
    """

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        num_envs: int,
        add_info: AddInfo,
        columns: Collection[Key] = (),
    ) -> None:
        self.num_envs = num_envs
        self.observations: Any = create_empty_array(observation_space, n=num_envs, fn=np.zeros)
        self.ended = np.zeros(num_envs, dtype=np.bool_)
        """Which envs ended their episode on the last step (and were not reset since)."""
        root = observation_root(observation_space)
        self._read_obs = obs_reader(observation_space, root)
        self._read_columns = column_reader(observation_space, root, columns)
        self._copy = tree_copy(observation_space)
        self._set_rows = tree_set_rows(observation_space, num_envs)
        self._add_info = add_info

    def reset(self, td: TensorDictBase, rows: list[int], copy: bool) -> tuple[Any, dict[str, Any]]:
        """The observations (copies if ``copy``) and infos after resetting envs ``rows``, whose
        results ``td`` holds."""
        obs = self._read_obs(td)
        n = len(rows)
        if n == self.num_envs:
            self.observations = obs
            self.ended[:] = False
        else:
            index = np.asarray(rows)
            self.observations = self._set_rows(self.observations, obs, index)
            self.ended[index] = False
        infos: dict[str, Any] = {}
        carries = read_carries(td, n)
        if carries is not None:
            for row, carried in zip(rows, carries, strict=True):
                if carried is not None:
                    infos = self._add_info(infos, carried.info, row)
        return (self._copy(self.observations) if copy else self.observations), infos

    def step(self, td: TensorDictBase, copy: bool) -> StepReturn:
        """What a step of every env returns (observations copied if ``copy``), from the pool's
        step results ``td``."""
        nxt = td["next"]
        self.observations = self._read_obs(nxt)
        return self._stepped(
            nxt["reward"].numpy(),
            nxt["terminated"].numpy().reshape(-1),
            nxt["truncated"].numpy().reshape(-1),
            read_carries(nxt, self.num_envs),
            copy,
        )

    def step_columns(self, columns: Mapping[Key, Any], copy: bool) -> StepReturn:
        """:meth:`step` from the pool's step results of every env in order as columns
        (:meth:`aenvs.AsyncEnvPool.async_step_recv_columns`); only where :attr:`reads_columns`."""
        read = self._read_columns
        assert read is not None, "the observations are not all fixed-shape columns"
        self.observations = read(columns)
        info = columns.get(_INFO)
        return self._stepped(
            np.asarray(columns[_REWARD]),
            np.asarray(columns[_TERMINATED]).reshape(-1),
            np.asarray(columns[_TRUNCATED]).reshape(-1),
            None if info is None else carries_of(info, self.num_envs),
            copy,
        )

    @property
    def reads_columns(self) -> bool:
        """Whether :meth:`step_columns` can read the observations (every part a fixed-shape
        entry of the step results)."""
        return self._read_columns is not None

    def _stepped(
        self,
        reward: npt.NDArray[Any],
        terminations: npt.NDArray[np.bool_],
        truncations: npt.NDArray[np.bool_],
        carries: list[Carry | None] | None,
        copy: bool,
    ) -> StepReturn:
        rewards: npt.NDArray[np.float64] = reward.reshape(-1).astype(np.float64)
        np.logical_or(terminations, truncations, out=self.ended)
        infos: dict[str, Any] = {}
        if carries is not None:
            for i, carried in enumerate(carries):
                if carried is not None:
                    if carried.reward is not None:
                        rewards[i] = carried.reward
                    infos = self._add_info(infos, carried.info, i)
        obs = self._copy(self.observations) if copy else self.observations
        return obs, rewards, terminations, truncations, infos


def read_carries(td: TensorDictBase, n: int) -> list[Carry | None] | None:
    """Each env's :class:`~aenvs._adapters.autoreset.Carry` (or None) from the ``"info"`` entry of a
    batch of ``n``, or None if none has one.

    Example:
        >>> from tensordict import TensorDict
        >>> read_carries(TensorDict({}, [2]), 2) is None
        True
    """
    info = cast(Any, td).get("info", None)  # not _tensors.td_get: it imports torch
    return None if info is None else carries_of(info, n)


def carries_of(info: Any, n: int) -> list[Carry | None]:
    """Each env's :class:`~aenvs._adapters.autoreset.Carry` (or None) from the ``"info"``
    entry of a batch of ``n``: a list of values, or a non-tensor stack or datum of tensordict.

    Example:
        >>> carries_of([None, Carry({"x": 1})], 2)[1].info
        {'x': 1}
    """
    if type(info) is list:
        values = cast("list[Any]", info)
    else:
        values = info.tolist() if hasattr(info, "tolist") else [info.data] * n
    return [v if isinstance(v, Carry) else None for v in values]


Copier = Callable[[Any], Any]
RowSetter = Callable[[Any, Any, "npt.NDArray[np.intp]"], Any]


def tree_copy(space: spaces.Space[Any]) -> Copier:
    """A function copying a batch of ``space``: arrays copied, the tuples of the parts
    without a fixed shape deep-copied (gymnasium deep-copies its batches); built once.

    Example:
        >>> tree_copy(spaces.Dict({"a": spaces.Discrete(2)}))({"a": np.zeros(2)})
        {'a': array([0., 0.])}
        >>> tree_copy(spaces.Text(4))(("ab", "c"))
        ('ab', 'c')
    """
    if (items := dict_parts(space)) is not None:
        parts = [(k, tree_copy(sub)) for k, sub in items]
        return lambda value: {k: copy_part(value[k]) for k, copy_part in parts}
    if (subs := tuple_parts(space)) is not None:
        copies = [tree_copy(sub) for sub in subs]
        return lambda value: tuple(copy_part(v) for copy_part, v in zip(copies, value, strict=True))
    if is_array_space(space):
        return lambda value: cast("npt.NDArray[Any]", value).copy()
    return deepcopy


def tree_set_rows(space: spaces.Space[Any], num_envs: int) -> RowSetter:
    """A function ``(old, new, rows)`` returning a copy of the batch ``old`` of ``space`` with
    ``rows`` taken from ``new`` (which holds only those rows); built once.

    Example:
        >>> tree_set_rows(spaces.Discrete(2), 3)(np.zeros(3), np.ones(1), np.array([1]))
        array([0., 1., 0.])
        >>> tree_set_rows(spaces.Text(4), 3)(("a", "b", "c"), ("x",), np.array([2]))
        ('a', 'b', 'x')
    """
    if (items := dict_parts(space)) is not None:
        parts = [(k, tree_set_rows(sub, num_envs)) for k, sub in items]
        return lambda old, new, rows: {k: set_rows(old[k], new[k], rows) for k, set_rows in parts}
    if (subs := tuple_parts(space)) is not None:
        setters = [tree_set_rows(sub, num_envs) for sub in subs]
        return lambda old, new, rows: tuple(
            set_rows(o, n, rows) for set_rows, o, n in zip(setters, old, new, strict=True)
        )
    if is_array_space(space):
        return _set_array_rows

    def set_value_rows(old: Any, new: Any, rows: npt.NDArray[np.intp]) -> tuple[Any, ...]:
        values: list[Any] = list(old) if old is not None else [None] * num_envs  # a custom space's None
        for row, value in zip(rows.tolist(), new, strict=True):
            values[row] = value
        return tuple(values)

    return set_value_rows


def _set_array_rows(old: Any, new: Any, rows: npt.NDArray[np.intp]) -> npt.NDArray[Any]:
    out = cast("npt.NDArray[Any]", old).copy()
    out[rows] = new
    return out

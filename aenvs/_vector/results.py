"""Gymnasium's step and reset returns, out of the pool's TensorDicts.

:class:`Results` keeps a vector env's observations between calls (a ``reset_mask`` reset
replaces only some rows), which envs ended their episode, and merges what the members
carried beside the pool's layout (infos, float64 rewards) into vector infos.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

from aenvs._adapters.autoreset import Carry
from aenvs._specs import observation_root
from aenvs._vector.conversion import obs_reader
from aenvs._vector.spaces import dict_parts, is_array_space, tuple_parts

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["AddInfo", "Results", "StepReturn", "read_carries", "tree_copy", "tree_set_rows"]

AddInfo = Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]
"""``VectorEnv._add_info``: adds env ``i``'s info to vector infos, returns them."""

StepReturn = tuple[
    Any, "npt.NDArray[np.float64]", "npt.NDArray[np.bool_]", "npt.NDArray[np.bool_]", dict[str, Any]
]
"""``(observations, rewards, terminations, truncations, infos)``, as ``VectorEnv.step`` returns them."""


class Results:
    """The returns of one vector env's steps and resets, built from the pool's TensorDicts.

    Args:
        observation_space: each env's observation space.
        num_envs: how many envs.
        add_info: the vector env's ``_add_info``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> results = Results(spaces.Discrete(3), 2, add_info=lambda infos, info, i: infos)
        >>> results.reset(TensorDict({"observation": torch.tensor([1])}, [1]), [1], copy=True)
        (array([0, 1]), {})
    """

    def __init__(self, observation_space: spaces.Space[Any], num_envs: int, add_info: AddInfo) -> None:
        self.num_envs = num_envs
        self.observations: Any = create_empty_array(observation_space, n=num_envs, fn=np.zeros)
        self.ended = np.zeros(num_envs, dtype=np.bool_)
        """Which envs ended their episode on the last step (and were not reset since)."""
        self._read_obs = obs_reader(observation_space, observation_root(observation_space))
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
        rewards: npt.NDArray[np.float64] = nxt["reward"].numpy().reshape(-1).astype(np.float64)
        terminations: npt.NDArray[np.bool_] = nxt["terminated"].numpy().reshape(-1)
        truncations: npt.NDArray[np.bool_] = nxt["truncated"].numpy().reshape(-1)
        np.logical_or(terminations, truncations, out=self.ended)
        infos: dict[str, Any] = {}
        carries = read_carries(nxt, self.num_envs)
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
    if info is None:
        return None
    values: list[Any] = info.tolist() if hasattr(info, "tolist") else [info.data] * n
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

"""Gymnasium's step and reset returns, out of the pool's TensorDicts.

:class:`Results` keeps a vector env's observations between calls (a ``reset_mask`` reset
replaces only some rows), which envs ended their episode, and merges what the members
carried beside the pool's layout (infos, float64 rewards) into vector infos.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

from aenvs._adapters.autoreset import Carry
from aenvs._specs import observation_root
from aenvs._vector.conversion import obs_reader

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
            self.observations = tree_set_rows(self.observations, obs, index)
            self.ended[index] = False
        infos: dict[str, Any] = {}
        carries = read_carries(td, n)
        if carries is not None:
            for row, carried in zip(rows, carries, strict=True):
                if carried is not None:
                    infos = self._add_info(infos, carried.info, row)
        return (tree_copy(self.observations) if copy else self.observations), infos

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
        obs = tree_copy(self.observations) if copy else self.observations
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


def tree_copy(value: Any) -> Any:
    """A copy of a batch of observations: an array, or a dict or tuple of them.

    Example:
        >>> tree_copy({"a": np.zeros(2)})
        {'a': array([0., 0.])}
    """
    if isinstance(value, np.ndarray):
        return cast("npt.NDArray[Any]", value).copy()
    if isinstance(value, dict):
        return {k: tree_copy(v) for k, v in cast("dict[str, Any]", value).items()}
    return tuple(tree_copy(v) for v in value)


def tree_set_rows(old: Any, new: Any, rows: npt.NDArray[np.intp]) -> Any:
    """A copy of ``old`` with ``rows`` taken from ``new`` (which holds only those rows).

    Example:
        >>> tree_set_rows(np.zeros(3), np.ones(1), np.array([1]))
        array([0., 1., 0.])
    """
    if isinstance(old, np.ndarray):
        out = cast("npt.NDArray[Any]", old).copy()
        out[rows] = new
        return out
    if isinstance(old, dict):
        return {k: tree_set_rows(v, new[k], rows) for k, v in cast("dict[str, Any]", old).items()}
    return tuple(tree_set_rows(o, n, rows) for o, n in zip(old, new, strict=True))

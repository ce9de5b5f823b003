"""What a collector yields: whole episodes and fixed-size batches of transitions.

Both keep their transitions as references to rows of the batches they came in, and build
their TensorDict on first use: a consumer that reads only some fields (the return, the
length, one text column) pays for no TensorDict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs._collect.columns import build_transitions
from aenvs._tensors import td_get

__all__ = ["Episode", "FrameBatch", "Transitions"]


class Transitions:
    """Transitions recorded as references (see :func:`build_transitions`), their TensorDict
    built once, when first asked for.

    Example:
        >>> from tensordict import TensorDict
        >>> from aenvs._collect.columns import Columns
        >>> acted = Columns(TensorDict({"action": torch.tensor([1])}, [1]))
        >>> stepped = Columns(TensorDict({"reward": torch.full((1, 1), 2.0)}, [1]))
        >>> Transitions([acted, 0, stepped, 0]).td["next", "reward"].tolist()
        [[2.0]]
    """

    __slots__ = ("_record", "_td")

    def __init__(self, record: Sequence[Any]) -> None:
        self._record: Sequence[Any] | None = record
        self._td: TensorDictBase | None = None

    def __len__(self) -> int:
        return len(self._record) // 4 if self._record is not None else int(self.td.batch_size[0])

    @property
    def td(self) -> TensorDictBase:
        """batch ``[T]``, in TorchRL's layout: per transition the observation the policy saw,
        the entries it wrote (``"action"``, log-probs...), ``"env_index"`` and ``"episode"``
        at the root; the env's answer under ``"next"`` (observation, ``"reward"``,
        ``"done"``, ``"terminated"``, ``"truncated"``, and ``"timed_out"`` where the pool's
        deadlines truncate)."""
        if self._td is None:
            assert self._record is not None
            self._td = build_transitions(self._record)
            self._record = None  # the batches it refers to can go
        return self._td

    def next_values(self, key: str) -> list[Any] | None:
        """Per transition, ``("next", key)`` read from the batches (None once the TensorDict
        is built, or where the batches cannot be read by column)."""
        record = self._record
        if record is None:
            return None
        out: list[Any] = []
        for j in range(2, len(record), 4):
            leaves = record[j].leaves
            if leaves is None or (key,) not in leaves:
                return None
            out.append(leaves[(key,)][record[j + 1]])
        return out

    def _flag(self, key: str) -> bool:
        record = self._record
        if record is not None:
            leaves = record[-2].leaves
            if leaves is not None:
                value = leaves.get((key,))
                return value is not None and bool(np.any(value[record[-1]]))
        flag = td_get(self.td, ("next", key))
        return bool(isinstance(flag, torch.Tensor) and flag.numel() and flag[-1].any())


class Episode(Transitions):
    """One finished episode of one env, its transitions in TorchRL's layout (:attr:`~aenvs.Episode.td`).

    Attributes:
        env_index: the env that ran it.
        episode_id: unique within the collector, in the order episodes started.
        task: the reset options it started from (None without tasks).

    Example:
        >>> from tensordict import TensorDict
        >>> from aenvs._collect.columns import Columns
        >>> acted = Columns(TensorDict({"action": torch.tensor([1, 0])}, [2]))
        >>> stepped = Columns(TensorDict({"reward": torch.ones(2, 1), "terminated": torch.tensor([[False], [True]])}, [2]))
        >>> episode = Episode([acted, 0, stepped, 0, acted, 1, stepped, 1], env_index=3, episode_id=7, task=None)
        >>> len(episode), episode.total_reward, episode.terminated, episode.truncated
        (2, 2.0, True, False)
    """

    __slots__ = ("env_index", "episode_id", "task")

    def __init__(self, record: Sequence[Any], *, env_index: int, episode_id: int, task: Any) -> None:
        super().__init__(record)
        self.env_index = env_index
        self.episode_id = episode_id
        self.task = task

    @property
    def length(self) -> int:
        """Steps taken."""
        return len(self)

    @property
    def total_reward(self) -> float:
        """The sum of the rewards (over every entry of ``("next", "reward")``)."""
        rewards = self.next_values("reward")
        if rewards is not None:
            return float(np.sum(rewards))
        return float(td_get(self.td, ("next", "reward")).sum())

    @property
    def terminated(self) -> bool:
        """Whether the episode ended by the env's rules."""
        return self._flag("terminated")

    @property
    def truncated(self) -> bool:
        """Whether it was cut short (a time limit, a deadline)."""
        return self._flag("truncated")

    @property
    def timed_out(self) -> bool:
        """Whether a pool deadline cut it short (``on_timeout="truncate"``)."""
        return self._flag("timed_out")

    def __repr__(self) -> str:
        return f"Episode(env_index={self.env_index}, episode_id={self.episode_id}, length={self.length})"


class FrameBatch(Transitions):
    """``frames_per_batch`` transitions of any envs, in the order they completed; each row of
    :attr:`~aenvs.FrameBatch.td` carries its ``"env_index"`` and ``"episode"``.

    Attributes:
        index: 0 for the first batch, then 1, 2...

    Example:
        >>> from tensordict import TensorDict
        >>> from aenvs._collect.columns import Columns
        >>> acted = Columns(TensorDict({"action": torch.tensor([1, 0])}, [2]))
        >>> stepped = Columns(TensorDict({"reward": torch.ones(2, 1)}, [2]))
        >>> FrameBatch([acted, 0, stepped, 0, acted, 1, stepped, 1], index=0).frames
        2
    """

    __slots__ = ("index",)

    def __init__(self, record: Sequence[Any], *, index: int) -> None:
        super().__init__(record)
        self.index = index

    @property
    def frames(self) -> int:
        """Transitions in the batch."""
        return len(self)

    def __repr__(self) -> str:
        return f"FrameBatch(index={self.index}, frames={self.frames})"

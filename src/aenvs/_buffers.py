"""Per-leaf buffers with one row per env: where results are written and actions read.

Envs whose layouts agree share a group, whose buffers have shape
``[envs in group, *leaf shape]``. Workers write results into their envs' rows and
read actions from them; the pool reads whole batches out with one indexing
operation per leaf. The memory comes from an allocator, so the process executor
can put the same layout in shared memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from aenvs._specs import EnvSpec, Key, Leaf

__all__ = ["BufferGroup", "Buffers", "EnvRows"]

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.zeros(shape, dtype)


@dataclass(frozen=True, slots=True)
class EnvRows:
    """One env's rows of its group's buffers (numpy views; writes land in the buffers)."""

    reset: dict[Key, np.ndarray]
    step: dict[Key, np.ndarray]
    action: dict[Key, np.ndarray]
    row: int
    group: BufferGroup | None = None  # the group whose buffers these rows are of


@dataclass(frozen=True, slots=True)
class BufferGroup:
    """The buffers shared by envs with the same layout."""

    env_indices: tuple[int, ...]
    reset_leaves: tuple[Leaf, ...]
    step_leaves: tuple[Leaf, ...]
    action_leaves: tuple[Leaf, ...]
    reset: dict[Key, np.ndarray]
    step: dict[Key, np.ndarray]
    action: dict[Key, np.ndarray]

    def rows(self, row: int) -> EnvRows:
        def views(buffers: dict[Key, np.ndarray]) -> dict[Key, np.ndarray]:
            # slice + reshape keeps 0-d rows as writable views, not copies
            return {k: b[row : row + 1].reshape(b.shape[1:]) for k, b in buffers.items()}

        return EnvRows(views(self.reset), views(self.step), self.action, row, self)


class Buffers:
    """All the buffers of a pool, grouped by layout.

    Example:
        >>> from gymnasium import spaces
        >>> spec = EnvSpec.from_spaces(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
        >>> buffers = Buffers.allocate([spec, spec])
        >>> buffers.groups[0].step[("observation",)].shape
        (2, 3)
    """

    def __init__(self, groups: list[BufferGroup], location: list[tuple[int, int]]) -> None:
        self.groups = groups
        self.location = location  # env index -> (group index, row)

    @classmethod
    def allocate(cls, specs: Sequence[EnvSpec], alloc: Allocator = _zeros) -> Buffers:
        """One group of buffers per distinct layout among ``specs``, one row per env;
        ``alloc(shape, dtype)`` gives the memory (zeros by default, shared memory on the
        process executor)."""
        by_layout: dict[tuple[tuple[Leaf, ...], tuple[Leaf, ...], tuple[Leaf, ...]], list[int]] = {}
        for index, spec in enumerate(specs):
            by_layout.setdefault((spec.reset_leaves, spec.step_leaves, spec.action_leaves), []).append(index)
        groups: list[BufferGroup] = []
        location: list[tuple[int, int]] = [(0, 0)] * len(specs)
        for (reset_leaves, step_leaves, action_leaves), members in by_layout.items():
            n = len(members)

            def make(leaves: tuple[Leaf, ...], n: int = n) -> dict[Key, np.ndarray]:
                # Python values (object leaves) cannot live in shared memory: each process
                # holds its own, and commands carry what the envs need (Command.object_actions)
                return {
                    leaf.key: np.full((n, *leaf.shape), None, object)
                    if leaf.is_object
                    else alloc((n, *leaf.shape), leaf.dtype)
                    for leaf in leaves
                }

            for row, index in enumerate(members):
                location[index] = (len(groups), row)
            groups.append(
                BufferGroup(
                    tuple(members),
                    reset_leaves,
                    step_leaves,
                    action_leaves,
                    make(reset_leaves),
                    make(step_leaves),
                    make(action_leaves),
                )
            )
        return cls(groups, location)

    def rows(self, env_index: int) -> EnvRows:
        """Env ``env_index``'s rows of its group's buffers (views: writes land in the buffers)."""
        group, row = self.location[env_index]
        return self.groups[group].rows(row)

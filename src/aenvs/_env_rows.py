"""An env's place in a runner: its adapter and buffer rows, looked up once (:class:`EnvSlot`);
and the rows of every env a runner hosts as columns, when they are one run of rows
(:class:`ColumnRun`), so that a whole command writes its step scalars a column at a time."""

from __future__ import annotations

import reprlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from aenvs._buffers import EnvRows
from aenvs._specs import Key

__all__ = ["ColumnRun", "EnvSlot"]

_REWARD, _DONE, _TERMINATED, _TRUNCATED = ("reward",), ("done",), ("terminated",), ("truncated",)
_FLAGS = (_DONE, _TERMINATED, _TRUNCATED)  # the step's flags, which a reset writes as False


@dataclass(slots=True)
class EnvSlot:
    """One env of a runner: its adapter, and the rows it writes on every step, looked up
    once when its rows are attached."""

    adapter: Any
    rows: EnvRows | None = None
    # the step's scalar rows, looked up once: written for every env on every step
    reward: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    done: np.ndarray | None = None
    reset_flags: tuple[np.ndarray, ...] = ()
    carry: tuple[tuple[np.ndarray, np.ndarray], ...] = ()  # (reset row, step row) per observation leaf
    # a native env with one observation entry at its root: that entry's name and step row
    plain_name: str | None = None
    plain_row: np.ndarray | None = None
    # a plain gymnasium env with an array observation: its env's step, its action reader
    # (row -> the action as the env's space expects it) and its observation row
    env_step: Any = None
    read_action: Any = None
    row: int = 0
    array_row: np.ndarray | None = None
    # an env with a batch shape of its own: its reset of the sub-envs that ended, else None
    autoreset: Any = None
    closed: bool = False  # its adapter's close ran (or was started): never again
    # the kind of env it is while no env of its kind has reset and stepped yet: its resets and
    # steps take the build lock (aenvs._adapters.first_use), not the array path; None after
    env_kind: Hashable | None = None
    # its observation's Text parts by key (their values must be str), None if it has none
    texts: Mapping[Key, Any] | None = None

    def close(self) -> Any:
        """Start closing the env once: what its ``close`` returned (awaitable for an async env),
        None on a second call."""
        if self.closed:
            return None
        self.closed = True
        return self.adapter.close()

    def write_items(self, part: dict[Key, np.ndarray], items: list[tuple[Key, Any]]) -> dict[Key, Any] | None:
        """Write a result's entries into their rows of ``part`` (the env's reset or step rows);
        return those without a row (text, token lists, infos...), or None. An entry whose
        shape is not its space's, or a text observation that is not a str, raises."""
        extras: dict[Key, Any] | None = None
        texts = self.texts
        for key, value in items:
            view = part.get(key)
            if view is None:
                if texts is not None and key in texts and not isinstance(value, str):
                    # its length and charset: the pool's checks (check_finite), where they are on
                    raise TypeError(
                        f"the env returned {reprlib.repr(value)} ({type(value).__name__}) as "
                        f"{'.'.join(key)!r}, but its space {texts[key]} holds a str"
                    )
                if extras is None:
                    extras = {}
                extras[key] = value
                continue
            shape = value.shape if type(value) is np.ndarray else np.shape(value)
            if shape != view.shape:
                raise ValueError(
                    f"the env returned {'.'.join(key)!r} with shape {tuple(shape)}, "
                    f"but its space says {tuple(view.shape)}"
                )
            view[...] = value
        return extras

    def write_scalars(self, reward: float, terminated: bool, truncated: bool, done: bool) -> None:
        """A step's reward and flags, into their rows."""
        self.reward[0] = reward  # pyright: ignore[reportOptionalSubscript] - attached with the rows
        self.terminated[0] = terminated  # pyright: ignore[reportOptionalSubscript]
        self.truncated[0] = truncated  # pyright: ignore[reportOptionalSubscript]
        self.done[0] = done  # pyright: ignore[reportOptionalSubscript]

    def carry_observation(self) -> None:
        """The next step's observation is this step's (its flags stay False: the episode goes on)."""
        for reset_row, step_row in self.carry:
            reset_row[...] = step_row

    def attach(self, rows: EnvRows) -> None:
        self.rows, self.row = rows, rows.row
        step = rows.step
        self.reward, self.done = step[_REWARD], step[_DONE]
        self.terminated, self.truncated = step[_TERMINATED], step[_TRUNCATED]
        self.plain_name = getattr(self.adapter, "plain_observation", None)
        self.plain_row = None if self.plain_name is None else step[(self.plain_name,)]
        array_key: Key | None = getattr(self.adapter, "array_observation", None)
        if array_key is not None and array_key in step and self.env_kind is None:
            self.env_step, self.array_row = self.adapter.env.step, step[array_key]
            self.read_action = self.adapter.action_reader(rows.action)
        else:
            self.env_step = self.read_action = self.array_row = None
        self.reset_flags = (rows.reset[_DONE], rows.reset[_TERMINATED], rows.reset[_TRUNCATED])
        self.autoreset = getattr(self.adapter, "autoreset", None)
        if self.autoreset is not None:
            # a batched env writes its per sub-env reward and flags among its items; its
            # Outcome's scalars (whether any sub-env ended) go to scratch rows, so that the
            # step path stays the same for every env
            self.reward, self.done, self.terminated, self.truncated = (
                np.zeros(1, t) for t in (np.float32, bool, bool, bool)
            )
            self.reset_flags = (np.zeros(1, bool),)
        self.carry = tuple((view, step[key]) for key, view in rows.reset.items() if key not in _FLAGS)


@dataclass(slots=True)
class ColumnRun:
    """The rows of every env a runner hosts as column slices, when they are consecutive rows
    of one buffer group in env order and every env steps on the array path: a command to
    all of them in that order writes its step scalars a column at a time, and carries its
    observations over (step-and-reset) a column at a time."""

    indices: list[int]
    scalars: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # reward, terminated, truncated, done
    carry: tuple[tuple[np.ndarray, np.ndarray], ...]  # (reset column, step column) per carried leaf

    @classmethod
    def of(cls, slots: Mapping[int, EnvSlot]) -> ColumnRun | None:
        """The run of ``slots`` (env index -> slot), or None where they are not one."""
        rows = [slot.rows for slot in slots.values()]
        if not rows or any(r is None or r.group is None for r in rows):
            return None
        first = rows[0]
        assert first is not None and first.group is not None
        group, start = first.group, first.row
        if any(
            r.group is not group or r.row != start + k or s.env_step is None or s.autoreset is not None  # pyright: ignore[reportOptionalMemberAccess]
            for k, (r, s) in enumerate(zip(rows, slots.values(), strict=True))
        ):
            return None
        stop = start + len(rows)
        step, reset = group.step, group.reset
        if any(step[key].shape[1:] != (1,) for key in (_REWARD, _TERMINATED, _TRUNCATED, _DONE)):
            return None  # not one scalar per env
        scalars = tuple(step[key][start:stop, 0] for key in (_REWARD, _TERMINATED, _TRUNCATED, _DONE))
        carry = tuple(
            (view[start:stop], step[key][start:stop]) for key, view in reset.items() if key not in _FLAGS
        )
        return cls(list(slots), cast("tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]", scalars), carry)

    def write(
        self, rewards: list[float], terminated: list[bool], truncated: list[bool], done: list[bool], smr: bool
    ) -> None:
        """Write the scalars of the first ``len(rewards)`` envs (all on the array path), and
        for a step-and-reset carry the observations of those whose episode goes on."""
        k = len(rewards)
        reward_col, terminated_col, truncated_col, done_col = self.scalars
        if k == len(reward_col):
            reward_col[...] = rewards
            terminated_col[...] = terminated
            truncated_col[...] = truncated
            done_col[...] = done[:k]
        else:
            reward_col[:k] = rewards
            terminated_col[:k] = terminated
            truncated_col[:k] = truncated
            done_col[:k] = done[:k]
        if smr and self.carry:
            goes_on = ~done_col[:k]
            for reset_col, step_col in self.carry:
                where = goes_on.reshape(k, *(1,) * (step_col.ndim - 1))
                np.copyto(reset_col[:k], step_col[:k], where=where)

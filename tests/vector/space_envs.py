"""Spaces without a fixed shape (Text, Sequence, Graph, OneOf, custom spaces, and Dict / Tuple
nesting them), and envs speaking them, for the vector and pool tests (importable by worker
processes)."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

BOX = spaces.Box(-1, 1, (2,), np.float32)


class Word(spaces.Space[str]):
    """A custom space: one of a few words (no batching function of gymnasium's knows it)."""

    WORDS = ("north", "south", "east", "west")

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(None, None, seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return self.WORDS[int(self.np_random.integers(len(self.WORDS)))]

    def contains(self, x: Any) -> bool:
        return x in self.WORDS

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Word)

    def __hash__(self) -> int:
        return hash(Word)


OBJECT_SPACES: dict[str, spaces.Space[Any]] = {
    "text": spaces.Text(6),
    "text_charset": spaces.Text(5, min_length=2, charset="abc"),
    "seq_box": spaces.Sequence(BOX),
    "seq_discrete": spaces.Sequence(spaces.Discrete(4)),
    "seq_box_stacked": spaces.Sequence(BOX, stack=True),
    "seq_discrete_stacked": spaces.Sequence(spaces.Discrete(4), stack=True),
    "seq_dict_stacked": spaces.Sequence(spaces.Dict({"a": BOX, "b": spaces.Discrete(3)}), stack=True),
    "graph": spaces.Graph(BOX, spaces.Discrete(3)),
    "graph_no_edges": spaces.Graph(spaces.Discrete(5), None),
    "oneof": spaces.OneOf((spaces.Discrete(3), BOX)),
    "custom": Word(),
    # Dict / Tuple nesting them beside fixed parts, each fixed part under its own root key
    "dict": spaces.Dict(
        {
            "text": spaces.Text(8),
            "pos": BOX,
            "tokens": spaces.Sequence(spaces.Discrete(10)),
            "inner": spaces.Dict(
                {"graph": spaces.Graph(BOX, None), "choice": spaces.OneOf((BOX, spaces.Text(2)))}
            ),
            "flags": spaces.MultiBinary(3),
        }
    ),
    "tuple_of_objects": spaces.Tuple((spaces.Text(4), spaces.Sequence(BOX, stack=True))),
}
"""Every kind of space without a fixed shape, alone and in a Dict / Tuple beside fixed parts."""

MIXED_SPACES: dict[str, spaces.Space[Any]] = {
    "dict_mixed": spaces.Dict(
        {
            "inner": spaces.Dict({"graph": spaces.Graph(BOX, None), "n": spaces.Discrete(3)}),
            "text": spaces.Text(4),
        }
    ),
    "tuple_mixed": spaces.Tuple(
        (spaces.OneOf((spaces.Discrete(2), spaces.Text(3))), spaces.MultiBinary(3), spaces.Sequence(BOX))
    ),
}
"""A sub-Dict or a Tuple whose parts mix fixed shapes and not: the fixed parts' buffers and
the non-tensor entries share a sub-TensorDict."""

ALL_SPACES = {**OBJECT_SPACES, **MIXED_SPACES}


class ObjectSpaceEnv(gym.Env[Any, Any]):
    """Random observations of ``ALL_SPACES[observation_space]``, seeded through ``reset``;
    episodes of 2 to 6 steps, float64 rewards, infos; the step checks its action against
    ``ALL_SPACES[action_space]`` (as gymnasium's vector envs hand it over)."""

    def __init__(
        self, observation_space: str = "text", action_space: str = "text", truncate: bool = False
    ) -> None:
        # own copies: an env seeds its observation space, and envs may run in threads
        self.observation_space = copy.deepcopy(ALL_SPACES[observation_space])
        self.action_space = copy.deepcopy(ALL_SPACES[action_space])
        self.truncate = truncate
        self.t = 0
        self.length = 0

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 7))
        return self._obs(), {"length": self.length}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} not in {self.action_space}"
        self.t += 1
        ended = self.t >= self.length
        info: dict[str, Any] = {"t": self.t, "action": repr(action)[:30]}
        reward = float(self.np_random.normal())
        return self._obs(), reward, ended and not self.truncate, ended and self.truncate, info


class OutOfSpaceTextEnv(gym.Env[str, str]):
    """Observes a str longer than its ``Text(4)`` observation space allows."""

    observation_space = spaces.Text(4)
    action_space = spaces.Text(4)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "far too long", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return "far too long", 0.0, False, False, {}

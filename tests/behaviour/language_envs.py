"""Envs that speak text, token ids and messages, for the non-tensor action tests (module-level
classes: the process and Ray executors pickle them by reference)."""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs import Env

WORDS = spaces.Text(16)


class EchoTextEnv(gym.Env[str, str]):
    """Observation ``"<step>:<action>"``; reward the action's length; "quit" ends the episode."""

    observation_space = spaces.Text(64, charset=frozenset(string.ascii_letters + string.digits + ":"))
    action_space = WORDS

    def __init__(self) -> None:
        self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"EchoTextEnv got {type(action).__name__}")
        self.steps += 1
        return f"{self.steps}:{action}", float(len(action)), action == "quit", False, {}


class Anything(spaces.Space[Any]):
    """A space holding any Python value (a chat message, a tool call)."""

    def __init__(self) -> None:
        super().__init__(None, None)

    def contains(self, x: Any) -> bool:
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        return {"role": "user", "content": "hello"}


class ToolEnv(Env):
    """A native env taking a token list and a message; observes ``"<sum of tokens>|<content>"``."""

    observation_space = spaces.Text(64)
    action_space = spaces.Dict({"tokens": spaces.Sequence(spaces.Discrete(1000)), "message": Anything()})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"observation": "ready"}

    def step(self, td: TensorDictBase) -> dict[str, Any]:
        tokens, message = td["action", "tokens"], td["action", "message"]
        total = sum(int(t) for t in tokens)
        return {
            "observation": f"{total}|{message['content']}",
            "reward": float(len(tokens)),
            "terminated": False,
        }


class SaysEnv(gym.Env[Any, Any]):
    """A text env that observes ``says`` (any value, for the observation checks) ``at`` its
    resets (``"reset"``), its steps (``"step"``), or the resets after its first, each of its
    steps ending the episode (``"autoreset"``); ``"start"`` / ``"fine"`` otherwise."""

    observation_space = spaces.Text(8)  # 1 to 8 letters or digits
    action_space = spaces.Discrete(2)

    def __init__(self, says: Any = "fine", at: str = "step") -> None:
        assert at in ("reset", "step", "autoreset")
        self.says, self.at, self.resets = says, at, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets += 1
        bad = self.at == "reset" or (self.at == "autoreset" and self.resets > 1)
        return (self.says if bad else "start"), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return (self.says if self.at == "step" else "fine"), 0.0, self.at == "autoreset", False, {}

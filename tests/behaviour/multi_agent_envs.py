"""Multi-agent envs for the multi-agent tests (module-level classes: the process and Ray
executors pickle them by reference). Each records the action dicts it was stepped with in
``received``, for the tests to read back with ``pool.get_attr("received")``."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

WALKER_OBS = spaces.Box(-100, 100, (2,), np.float32)
WALKER_ACTION = spaces.Discrete(3)
GUARD_OBS = spaces.Box(-100, 100, (3,), np.float32)
GUARD_ACTION = spaces.Box(-1, 1, (2,), np.float32)


class Walkers(ParallelEnv[str, np.ndarray, Any]):
    """A PettingZoo parallel env whose walkers leave one by one.

    ``walker_i`` observes ``[i, t]``, takes a Discrete(3) action (its reward) and leaves,
    terminated, after ``i + 2`` steps. ``guard_0`` observes ``[t, walkers left, 0]``, takes
    a Box(2) action (reward: its sum) and is terminated when the last walker leaves. Every
    agent still there at ``max_steps`` is truncated.
    """

    def __init__(self, n_walkers: int = 3, max_steps: int = 100, guard: bool = True) -> None:
        self.metadata = {"name": "walkers_v0"}
        self.n_walkers = n_walkers
        self.max_steps = max_steps
        self.possible_agents = [f"walker_{i}" for i in range(n_walkers)] + (["guard_0"] if guard else [])
        self.agents: list[str] = []
        self.t = 0
        self.received: list[dict[str, Any]] = []

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return GUARD_OBS if agent.startswith("guard") else WALKER_OBS

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return GUARD_ACTION if agent.startswith("guard") else WALKER_ACTION

    def _observe(self, agent: str) -> np.ndarray:
        if agent.startswith("guard"):
            left = sum(a.startswith("walker") for a in self.agents)
            return np.array([self.t, left, 0], np.float32)
        return np.array([int(agent.rsplit("_", 1)[1]), self.t], np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        if set(actions) != set(self.agents):
            raise KeyError(f"actions for {sorted(actions)}, but the live agents are {sorted(self.agents)}")
        self.received.append({a: _plain(v) for a, v in actions.items()})
        self.t += 1
        rewards = {a: float(np.sum(v)) if a.startswith("guard") else float(v) for a, v in actions.items()}
        terminations = {a: a.startswith("walker") and self.t >= int(a.rsplit("_", 1)[1]) + 2 for a in actions}
        walkers_left = [a for a in actions if a.startswith("walker") and not terminations[a]]
        if "guard_0" in actions:
            terminations["guard_0"] = not walkers_left
        truncations = {a: self.t >= self.max_steps and not terminations[a] for a in actions}
        infos: dict[str, dict[str, Any]] = {a: {} for a in actions}
        observations = {a: self._observe(a) for a in actions}
        self.agents = [a for a in self.agents if not terminations[a] and not truncations[a]]
        return observations, rewards, terminations, truncations, infos


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


class Convoy:
    """An RLlib-style dict env (RLlib's ``MultiAgentEnv`` protocol, without RLlib).

    ``car_0`` and ``car_1`` drive from the reset on (observe ``[car index, t]``, Discrete(2)
    actions, reward the action); ``light`` joins at step 2 (it gets its first observation
    then, so it acts from step 3; observes ``t % 4``, Discrete(3) actions, reward 10 times
    the action, info ``{"colour": ...}``). ``car_1`` is terminated at step 3; the episode
    ends at step ``length`` through ``"__all__"``.
    """

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.possible_agents = ["car_0", "car_1", "light"]
        car_obs, car_action = spaces.Box(-100, 100, (2,), np.float32), spaces.Discrete(2)
        self.observation_spaces: dict[str, spaces.Space[Any]] = {
            "car_0": car_obs,
            "car_1": car_obs,
            "light": spaces.Discrete(4),
        }
        self.action_spaces: dict[str, spaces.Space[Any]] = {
            "car_0": car_action,
            "car_1": car_action,
            "light": spaces.Discrete(3),
        }
        self.t = 0
        self.gone: set[str] = set()
        self.received: list[dict[str, Any]] = []

    def _observe(self, agent: str) -> Any:
        return self.t % 4 if agent == "light" else np.array([int(agent[-1]), self.t], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.t = 0
        self.gone = set()
        return {a: self._observe(a) for a in ("car_0", "car_1")}, {}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        self.received.append(dict(actions))
        self.t += 1
        rewards = {a: float(v) * (10 if a == "light" else 1) for a, v in actions.items()}
        terminateds: dict[str, bool] = {"__all__": self.t >= self.length}
        if self.t == 3:
            terminateds["car_1"] = True
            self.gone.add("car_1")
        present = [a for a in ("car_0", "car_1") if a in actions or a not in self.gone]
        if self.t >= 2:
            present.append("light")
        observations = {a: self._observe(a) for a in present}
        infos = {"light": {"colour": "red"}} if "light" in observations else {}
        return observations, rewards, terminateds, {"__all__": False}, infos

    def close(self) -> None:
        pass


class Pair:
    """An RLlib-style dict env with int agent ids and spaces given by methods: agents 0 and 1
    observe ``[t, own id]`` and echo their Box(1) action as their reward; ends at step 3."""

    possible_agents = (0, 1)

    def __init__(self) -> None:
        self.t = 0
        self.received: list[dict[Hashable, Any]] = []

    def get_observation_space(self, agent: int) -> spaces.Space[Any]:
        return spaces.Box(-100, 100, (2,), np.float32)

    def get_action_space(self, agent: int) -> spaces.Space[Any]:
        return spaces.Box(-10, 10, (1,), np.float32)

    def _observations(self) -> dict[int, np.ndarray]:
        return {a: np.array([self.t, a], np.float32) for a in self.possible_agents}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
        self.t = 0
        return self._observations(), {}

    def step(self, actions: dict[int, np.ndarray]) -> tuple[dict[Any, Any], ...]:
        self.received.append({a: _plain(v) for a, v in actions.items()})
        self.t += 1
        done = self.t >= 3
        rewards = {a: float(v[0]) for a, v in actions.items()}
        return self._observations(), rewards, {"__all__": done}, {"__all__": False}, {}

    def close(self) -> None:
        pass


class Stray(Convoy):
    """A dict env that observes an agent it never declared (``"ghost"``) at its first step."""

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        observations, *rest = super().step(actions)
        return ({**observations, "ghost": 0}, *rest)


class TurnBased:
    """Looks like a PettingZoo AEC env (``observe`` / ``last``): refused."""

    possible_agents = ("a_0",)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Discrete(2)

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> int:
        return 0

    def last(self) -> tuple[Any, ...]:
        return (0, 0.0, False, False, {})

    def close(self) -> None:
        pass

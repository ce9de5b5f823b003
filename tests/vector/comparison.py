"""Vector envs held against a reference run, for the equivalence tests (aenvs's against
gymnasium's): the reference is recorded once (:func:`record`), then each env under test
replays its actions and must return the same at every call (:func:`replay`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, VectorEnv


@dataclass
class Step:
    actions: Any
    results: Any  # (observations, rewards, terminations, truncations, infos)
    reset_mask: np.ndarray | None = None  # the partial reset after it (DISABLED mode), if any
    reset: Any = None  # that reset's (observations, infos)


@dataclass
class Trajectory:
    """What a vector env did in one autoreset ``mode`` from a reset with ``seed``."""

    mode: AutoresetMode
    seed: int
    reset: Any
    steps: list[Step] = field(default_factory=list)
    ended: int = 0  # episodes ended


def record(envs: VectorEnv, mode: AutoresetMode, steps: int = 100, seed: int = 123) -> Trajectory:
    """Reset ``envs`` with ``seed`` and take ``steps`` steps of actions sampled from its seeded
    batched action space; under ``DISABLED``, reset the envs whose episode ended after each step."""
    trajectory = Trajectory(mode, seed, envs.reset(seed=seed))
    envs.action_space.seed(seed)
    for _ in range(steps):
        actions = envs.action_space.sample()
        step = Step(actions, envs.step(actions))
        done = step.results[2] | step.results[3]
        trajectory.ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            step.reset_mask = done
            step.reset = envs.reset(options={"reset_mask": done})
        trajectory.steps.append(step)
    return trajectory


def replay(envs: VectorEnv, trajectory: Trajectory) -> int:
    """Take ``trajectory``'s actions (and partial resets) in ``envs`` and assert the same
    results at every call; return how many episodes ended."""
    assert data_equivalence(envs.reset(seed=trajectory.seed), trajectory.reset, exact=True)
    for t, step in enumerate(trajectory.steps):
        got = envs.step(step.actions)
        assert data_equivalence(got, step.results, exact=True), f"step {t}:\n{got}\n!=\n{step.results}"
        if step.reset_mask is not None:
            got_reset = envs.reset(options={"reset_mask": step.reset_mask})
            assert data_equivalence(got_reset, step.reset, exact=True), f"reset after step {t}"
    return trajectory.ended


def run_both(
    ours: VectorEnv, theirs: VectorEnv, mode: AutoresetMode, steps: int = 100, seed: int = 123
) -> int:
    """:func:`record` ``theirs``, then :func:`replay` it in ``ours``; how many episodes ended."""
    return replay(ours, record(theirs, mode, steps, seed))

"""tensordict 0.14 (what TorchRL 0.14 pins) leaves LAZY_LEGACY_OP="None" in os.environ after
stacking TensorDicts whose keys differ, and every later subprocess importing tensordict then
fails. aenvs stacks such TensorDicts (infos that differ between envs or steps): it must leave
the variable as it was. Run in a fresh interpreter that has not imported torchrl (whose import
sets the variable, hiding the bug)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.torchrl

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import gymnasium as gym
    import numpy as np
    import torch
    import aenvs

    class Chatty(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, name):
            self.name = name

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.float32), {"start": self.name}

        def step(self, action):
            info = {"who": self.name} if self.name == "a" else {"score": 3}
            return np.zeros(1, np.float32), 0.0, False, False, info

    assert "torchrl" not in sys.modules
    before = os.environ.get("LAZY_LEGACY_OP")
    with aenvs.SerialEnv(2, [lambda: Chatty("a"), lambda: Chatty("b")]) as env:
        env.rollout(3, break_when_any_done=False)  # per-env infos differ, and reset's from step's
    assert os.environ.get("LAZY_LEGACY_OP") == before, os.environ.get("LAZY_LEGACY_OP")
    print("kept", before)
    """
)


def test_stacking_infos_that_differ_keeps_lazy_legacy_op_unset() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LAZY_LEGACY_OP"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kept None"

"""Smoke test of examples/sb3_ppo.py: a few rollouts on aenvs' SB3 vector env."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "sb3_ppo.py"


@pytest.mark.parametrize("executor", ["inline"])  # process: test_ppo_learns_under_vec_normalize
def test_sb3_ppo_example_trains_and_evaluates(executor: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--total-timesteps", "256", "--executor", executor],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    out = result.stdout
    assert f"aenvs.sb3.VecEnv ({executor} executor)" in out
    assert re.search(r"^steps: 256 ", out, re.MULTILINE), out
    assert re.search(r"^mean return of 10 evaluation episodes: [0-9.]+ \+- [0-9.]+$", out, re.MULTILINE), out

"""Smoke test of examples/cleanrl_ppo.py: a few thousand steps on each vector env."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "cleanrl_ppo.py"
NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def run_ppo(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--total-timesteps", "4096", "--seed", "3", *args],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    return result.stdout


def numbers(pattern: str, text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in re.findall(pattern, text, re.MULTILINE)]


def test_cleanrl_ppo_learns_the_same_on_aenvs_and_on_gymnasium() -> None:
    ours = run_ppo("--executor", "thread")
    theirs = run_ppo("--vector-env", "gymnasium")
    assert "aenvs vector env (thread executor)" in ours
    assert "gymnasium vector env" in theirs
    for out in (ours, theirs):
        assert numbers(rf"^total steps: {NUMBER} ", out) == [4096]
        assert numbers(rf"wall time: {NUMBER} s", out)[0] > 0
        assert numbers(rf"^  steps +0-10,000 +episodes +{NUMBER}", out)[0] > 0
    # the vector envs give the same results step for step: the same seed learns the same curve
    curve = r"^(?:step|  steps) .*$"
    assert re.findall(curve, ours, re.MULTILINE) and [
        re.sub(r"steps/s +[0-9]+", "", line) for line in re.findall(curve, ours, re.MULTILINE)
    ] == [re.sub(r"steps/s +[0-9]+", "", line) for line in re.findall(curve, theirs, re.MULTILINE)]
    assert (
        numbers(rf"final mean return \(last 20 episodes\): {NUMBER}", ours)[0] > 9
    )  # CartPole pays 1 a step

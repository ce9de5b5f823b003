"""Smoke tests of the examples (run as scripts) and of the ``aenvs`` command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from aenvs._specs import EnvSpec
from aenvs.cli import RandomActions, build_parser, main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def run_script(*args: str, timeout: float = 120) -> str:
    """Run a Python script or module (``-m``) in a fresh interpreter; return its stdout."""
    result = subprocess.run(
        [sys.executable, *args], check=True, timeout=timeout, capture_output=True, text=True
    )
    return result.stdout


def number(pattern: str, text: str) -> list[float]:
    """Every number matched by ``pattern`` (with one NUMBER group) in ``text``."""
    return [float(m.replace(",", "")) for m in re.findall(pattern, text, re.MULTILINE)]


# -- examples ---------------------------------------------------------------------------


def test_training_loop_runs_and_reports() -> None:
    out = run_script(
        str(EXAMPLES / "asyncio_training_loop.py"),
        *("--total-steps", "1024", "--num-envs", "4", "--rollout", "16", "--executor", "thread"),
    )
    (final,) = number(rf"final mean return \(last 20 episodes\): {NUMBER}", out)
    (sps,) = number(rf"^steps/s: {NUMBER}$", out)
    assert final > 0  # CartPole pays 1 per step: any finished episode has a positive return
    assert sps > 0
    progress = number(rf"^step +{NUMBER} ", out)
    assert progress and progress[-1] == 1024  # 1024 // (16 * 4) updates of 64 steps each


def test_overlap_example_reports_both_loops() -> None:
    out = run_script(
        str(EXAMPLES / "overlap_inference.py"),
        *("--steps", "120", "--num-envs", "8", "--min-get", "2", "--latency-ms", "1", "4", "--infer-ms", "1"),
    )
    assert "executor='inline'" in out and "executor='thread'" in out
    lockstep = number(rf"lockstep: +{NUMBER} steps/s", out)
    overlapped = number(rf"overlapped: +{NUMBER} steps/s", out)
    speedups = number(rf"speed-up: +{NUMBER}x", out)
    assert len(lockstep) == len(overlapped) == len(speedups) == 2
    assert all(x > 0 for x in [*lockstep, *overlapped, *speedups])
    assert number(rf"\({NUMBER} steps in", out) == [120.0] * 4  # every loop ran exactly --steps


def test_multi_agent_example_reports_per_group_returns() -> None:
    out = run_script(str(EXAMPLES / "multi_agent.py"), *("--steps", "200", "--num-envs", "3"))
    assert "executor='process'" in out
    (episodes,) = number(rf"^episodes finished: {NUMBER}$", out)
    assert episodes >= 3  # an episode lasts at most 40 steps: each env finished some
    (scout,) = number(rf"^scout: mean return {NUMBER} per episode", out)
    (hauler,) = number(rf"^hauler: mean return {NUMBER} per episode", out)
    assert scout > 0 and hauler > 0  # found food; carried while scouts were out


def test_agent_env_example_collects_every_task() -> None:
    out = run_script(str(EXAMPLES / "agent_env.py"), "--quick")
    (episodes,) = number(rf"^episodes: {NUMBER} in", out)
    assert episodes == 150  # one episode per task of the dataset, none lost or repeated
    (success,) = number(rf"^success rate: {NUMBER}%$", out)
    assert success > 80  # the rules answer all but the questions the tools cannot
    (timed_out,) = number(rf"^timed-out episodes: {NUMBER}$", out)
    assert timed_out >= 1  # the dataset asks for keys the search upstream hangs on
    (requests,) = number(rf"tool requests: {NUMBER}$", out)
    assert requests > episodes / 2  # the tools were really called over HTTP
    assert len(number(rf"^env latency: p50 {NUMBER} ms", out)) == 1


# -- the command line -------------------------------------------------------------------


def summary(text: str) -> dict[str, float]:
    return {
        "steps": number(rf"^steps: +{NUMBER} in", text)[0],
        "steps/s": number(rf"^steps/s: +{NUMBER}$", text)[0],
        "episodes": number(rf"^episodes finished: +{NUMBER}$", text)[0],
    }


@pytest.mark.parametrize("executor", ["inline", "thread", "ray"])  # ray: the tests' shared Ray instance
def test_cli_run(executor: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--steps", "2000", "--executor", executor, "--num-envs", "4", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"executor={executor}" in out and "stack=dense" in out
    s = summary(out)
    assert s["steps"] == 2000
    assert s["steps/s"] > 0
    assert s["episodes"] > 10  # random CartPole episodes last ~22 steps
    assert "mean episode return:" in out


def test_cli_run_lazy_stack_with_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "CartPole-v1", "--steps", "2000", "--stack", "lazy", "--executor", "inline"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "stack=lazy" in captured.out
    assert "steps/s:" in captured.out and "episodes finished:" in captured.out
    assert "2000/2000 steps" in captured.err  # the progress bar, on stderr


def test_cli_run_is_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    results = []
    for executor in ("inline", "thread"):
        assert main(["run", "--steps", "1000", "--seed", "3", "-e", executor, "--no-progress"]) == 0
        out = capsys.readouterr().out
        results.append([line for line in out.splitlines() if line.startswith(("episodes", "mean episode"))])
    assert results[0] == results[1]
    assert len(results[0]) == 3


def test_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("--num-envs", "--executor", "--steps", "--stack", "--seed", "ENV_ID", "CartPole-v1"):
        assert option in help_text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--num-envs", "0"])


def test_cli_reports_an_env_that_cannot_be_made(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "NoSuchEnv-v0", "--steps", "10", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "error: env 0 failed in make" in err and "NoSuchEnv" in err


def test_python_dash_m_aenvs() -> None:
    out = run_script("-m", "aenvs", "run", "--steps", "64", "--num-envs", "2", "--no-progress")
    assert "steps/s:" in out and "episodes finished:" in out


# -- random actions ---------------------------------------------------------------------


def test_random_actions_follow_each_envs_space() -> None:
    obs = spaces.Box(-1, 1, (2,))
    action_spaces = [spaces.Discrete(2), spaces.Discrete(3, start=10)]
    sampler = RandomActions([EnvSpec.from_spaces(obs, a) for a in action_spaces], dense=True, seed=0)
    assert sampler.vectorised
    actions = sampler(torch.tensor([1, 0] * 100))["action"].reshape(100, 2)
    assert actions.dtype == torch.int64
    assert set(actions[:, 0].tolist()) == {10, 11, 12}
    assert set(actions[:, 1].tolist()) == {0, 1}

    box = spaces.Box(np.array([0.0, -5.0], np.float32), np.array([1.0, 5.0], np.float32))
    sampler = RandomActions([EnvSpec.from_spaces(obs, box)] * 2, dense=True, seed=0)
    actions = sampler(torch.tensor([0, 1] * 100))["action"]
    assert actions.shape == (200, 2) and actions.dtype == torch.float32
    assert (actions >= torch.tensor([0.0, -5.0])).all() and (actions <= torch.tensor([1.0, 5.0])).all()


@pytest.mark.parametrize("dense", [True, False])
def test_random_actions_fall_back_to_space_sample(dense: bool) -> None:
    space = spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(-np.inf, np.inf, (2,))})
    sampler = RandomActions([EnvSpec.from_spaces(spaces.Box(-1, 1, (2,)), space)] * 3, dense=dense, seed=0)
    assert not sampler.vectorised
    td = sampler([2, 0])
    assert td.batch_size == (2,)
    assert td["action", "a"].dtype == torch.int64 and td["action", "b"].shape == (2, 2)
    assert type(td).__name__ == ("TensorDict" if dense else "LazyStackedTensorDict")

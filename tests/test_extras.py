"""Optional dependencies: without its package, each feature of an extra says what to install,
and nothing else of aenvs needs it. Each case runs in a fresh interpreter where the package
cannot be imported (``sys.modules[name] = None``, what an absent package looks like to import),
so that it holds whether or not this venv has the package."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_without(packages: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which ``packages`` cannot be imported."""
    prelude = f"import sys\nfor name in {packages!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


POOL = """
import asyncio, aenvs
async def main():
    async with aenvs.AsyncEnvPool("CartPole-v1", num_envs=1, executor={executor!r}) as pool:
        await pool.reset()
asyncio.run(main())
"""

MISSING = {
    "torchrl": (["torchrl"], "import aenvs.torchrl"),
    "torchrl-from-aenvs": (["torchrl"], "from aenvs.torchrl import ParallelEnv"),
    "serve": (["websockets"], "from aenvs import serve"),
    "serve-clients": (["websockets"], "import aenvs\naenvs.PolicyClient"),
    "ray-executor": (["ray"], POOL.format(executor="ray")),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_a_missing_extra_says_what_to_install(case: str) -> None:
    packages, code = MISSING[case]
    extra = case.split("-")[0]
    result = run_without(packages, code)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("aenvs._optional.MissingExtraError: "), result.stderr
    assert last.endswith(f"needs {packages[0]}, which is not installed: pip install 'aenvs[{extra}]'"), last


def test_the_missing_extra_error_is_a_module_not_found_error() -> None:
    """Code that catches ImportError (or pytest.importorskip) sees the missing package's name."""
    result = run_without(
        ["torchrl"],
        """
        try:
            import aenvs.torchrl
        except ModuleNotFoundError as exc:
            print(exc.name)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torchrl"


def test_the_core_runs_without_any_extra() -> None:
    """A pool on the process executor, a gymnasium vector env and the command line's run,
    without the packages of any extra (pygame included: CartPole steps without it) or tqdm."""
    result = run_without(
        ["torchrl", "ray", "websockets", "pettingzoo", "pygame", "aiohttp", "tqdm"],
        POOL.format(executor="process")
        + """
import gymnasium as gym
from aenvs.gymnasium import AsyncVectorEnv
envs = AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, executor="thread")
envs.reset(seed=0)
envs.step(envs.action_space.sample())
envs.close()
from aenvs.cli import main
assert main(["run", "--steps", "64", "--no-progress"]) == 0
print("ok")
""",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_multi_agent_envs_need_no_pettingzoo() -> None:
    """The pettingzoo extra is for building PettingZoo envs: aenvs recognises multi-agent envs
    by what they have, and runs an RLlib-style dict env without pettingzoo (or Ray)."""
    result = run_without(
        ["pettingzoo", "ray"],
        """
        import asyncio
        import numpy as np
        import torch
        from gymnasium import spaces
        import aenvs

        class Pair:
            possible_agents = ("a_0", "a_1")
            observation_spaces = dict.fromkeys(possible_agents, spaces.Box(-1, 1, (2,), np.float32))
            action_spaces = dict.fromkeys(possible_agents, spaces.Discrete(2))

            def reset(self, *, seed=None, options=None):
                return {a: np.zeros(2, np.float32) for a in self.possible_agents}, {}

            def step(self, actions):
                obs = {a: np.zeros(2, np.float32) for a in self.possible_agents}
                return obs, dict.fromkeys(actions, 1.0), {"__all__": True}, {"__all__": False}, {}

        async def main():
            async with aenvs.AsyncEnvPool([Pair] * 2, executor="inline") as pool:
                td = await pool.reset()
                td["a", "action"] = torch.zeros(2, 2, dtype=torch.int64)
                out, _ = await pool.step_and_maybe_reset(td)
                print(out["next", "a", "reward"].sum().item())

        asyncio.run(main())
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4.0"


def test_rendering_without_pygame_says_what_to_install() -> None:
    """Rendering gymnasium's classic-control envs needs pygame (the ``render`` extra): the
    env's own error reaches the caller, naming the package to install."""
    result = run_without(
        ["pygame"],
        """
        import gymnasium as gym
        from aenvs.gymnasium import AsyncVectorEnv
        envs = AsyncVectorEnv([lambda: gym.make("CartPole-v1", render_mode="rgb_array")], executor="inline")
        envs.reset(seed=0)
        try:
            envs.render()
        finally:
            envs.close()
        """,
    )
    assert result.returncode == 1
    assert "gymnasium[classic-control]" in result.stderr.strip().splitlines()[-1], result.stderr

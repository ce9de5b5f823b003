"""aenvs.sb3.VecEnv against Stable-Baselines3's DummyVecEnv, on every executor.

Step for step under the same seeds and actions: observations (Box, Dict, Tuple), rewards,
dones, infos (``terminal_observation``, ``TimeLimit.truncated``) and ``reset_infos``; alone
and under SB3's VecNormalize, VecMonitor and VecFrameStack. Then the calls (``env_method``,
``get_attr``, ``set_attr``, ``env_is_wrapped``, ``render``), seeds and options, and PPO.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.wrappers import TimeLimit
from stable_baselines3 import PPO
from stable_baselines3.common import vec_env as sb3
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.running_mean_std import RunningMeanStd

from aenvs import EnvError
from aenvs.sb3 import VecEnv
from tests.sb3.sb3_envs import CountingEnv, DictActionEnv, counting_env_fns

NUM_ENVS = 4


@pytest.fixture
def make_vec(executor: str) -> Iterator[Callable[..., VecEnv]]:
    """``envs = make_vec(env_fns, **options)`` on the test's executor, closed afterwards."""
    made: list[VecEnv] = []

    def make(env_fns: Any, **options: Any) -> VecEnv:
        envs = VecEnv(env_fns, executor=executor, **options)
        made.append(envs)
        return envs

    yield make
    for envs in made:
        envs.close()


def plain(value: Any) -> Any:
    """DummyVecEnv's OrderedDict observations as the plain dicts SubprocVecEnv gives."""
    return dict(value) if isinstance(value, dict) else value


def assert_same(ours: Any, theirs: Any, what: str) -> None:
    assert data_equivalence(plain(ours), plain(theirs), exact=True), f"{what}:\n{ours!r}\n!=\n{theirs!r}"


def run_both(ours: sb3.VecEnv, theirs: sb3.VecEnv, steps: int, seed: int = 0) -> int:
    """Step both the same way; assert every return equal; return how many episodes ended."""
    ours.seed(seed)
    theirs.seed(seed)
    assert_same(ours.reset(), theirs.reset(), "reset")
    assert_same(ours.unwrapped.reset_infos, theirs.unwrapped.reset_infos, "reset_infos")
    actions = np.random.default_rng(seed).integers(0, 3, (steps, ours.num_envs))
    ended = 0
    for t, action in enumerate(actions):
        got, expected = ours.step(action), theirs.step(action)
        for info in (*got[3], *expected[3]):
            info.get("episode", {}).pop("t", None)  # VecMonitor's wall time
        for name, a, b in zip(("obs", "rewards", "dones", "infos"), got, expected, strict=True):
            assert_same(a, b, f"step {t}: {name}")
        assert_same(ours.unwrapped.reset_infos, theirs.unwrapped.reset_infos, f"step {t}: reset_infos")
        ended += int(got[2].sum())
    return ended


@pytest.mark.parametrize("obs", ["box", "dict", "tuple"])
def test_steps_as_dummy_vec_env(make_vec: Callable[..., VecEnv], obs: str) -> None:
    ours = make_vec(counting_env_fns(obs))
    theirs = sb3.DummyVecEnv(counting_env_fns(obs))
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    assert run_both(ours, theirs, steps=12) >= 10  # terminated, truncated, and both at once
    theirs.close()


def test_terminal_observation_and_time_limit(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec(counting_env_fns())
    envs.reset()
    for _ in range(2):  # env 0 terminates after 2 steps
        obs, rewards, dones, infos = envs.step(np.zeros(NUM_ENVS, np.int64))
    assert dones.tolist() == [True, False, False, False] and rewards.dtype == np.float32
    assert infos[0]["TimeLimit.truncated"] is False and infos[0]["t"] == 2
    assert infos[0]["terminal_observation"].shape == (3,)
    assert not np.array_equal(infos[0]["terminal_observation"], obs[0])  # obs[0]: the new episode's
    assert envs.reset_infos[0] == {"seed": None, "options": None}
    assert "terminal_observation" not in infos[1]
    for _ in range(2):  # at step 4: env 2 terminates as TimeLimit truncates, env 3 truncated only
        obs, rewards, dones, infos = envs.step(np.zeros(NUM_ENVS, np.int64))
    assert dones.tolist() == [True, False, True, True]
    assert [info["TimeLimit.truncated"] for info in infos] == [False, False, False, True]
    assert envs.get_attr("t") == [0, 1, 0, 0]  # reset in the step that ended them


def test_seeds_and_options_apply_at_the_next_reset_once(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec(counting_env_fns())
    assert envs.seed(5) == [5, 6, 7, 8]
    envs.set_options([{"level": 1}, {}, {"level": 1}, {"level": 2}])  # per env, as SB3 keeps them
    assert envs.get_attr("last_options") == [None] * NUM_ENVS  # nothing happens before reset
    first = envs.reset()
    assert [info["seed"] for info in envs.reset_infos] == [5, 6, 7, 8]
    assert envs.get_attr("last_options") == [{"level": 1}, None, {"level": 1}, {"level": 2}]
    envs.seed(5)
    assert np.array_equal(envs.reset(), first)
    envs.reset()  # seeds and options are used once
    assert [info["seed"] for info in envs.reset_infos] == [None] * NUM_ENVS
    assert envs.get_attr("last_options") == [None] * NUM_ENVS


@pytest.mark.parametrize("wrap", ["normalize", "monitor", "frame_stack"])
def test_sb3_wrappers_on_top_match_dummy_vec_env(make_vec: Callable[..., VecEnv], wrap: str) -> None:
    wrappers: dict[str, Callable[[sb3.VecEnv], sb3.VecEnv]] = {
        "normalize": lambda venv: sb3.VecNormalize(venv, gamma=0.9),
        "monitor": sb3.VecMonitor,
        "frame_stack": lambda venv: sb3.VecFrameStack(venv, n_stack=3),
    }
    ours = wrappers[wrap](make_vec(counting_env_fns("boxes" if wrap == "frame_stack" else "box")))
    theirs = wrappers[wrap](sb3.DummyVecEnv(counting_env_fns("boxes" if wrap == "frame_stack" else "box")))
    assert run_both(ours, theirs, steps=12) >= 10
    if wrap == "monitor":  # VecMonitor's episode records come from the dones and rewards
        assert ours.episode_count == theirs.episode_count > 0  # pyright: ignore[reportAttributeAccessIssue]
    theirs.close()


def test_calls_attributes_and_indices(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec([lambda f=env_fn: Monitor(f()) for env_fn in counting_env_fns()])
    envs.reset()
    assert envs.env_method("double", 3, plus=1) == [7] * NUM_ENVS
    assert envs.env_method("double", 1, indices=[0, -1]) == [2, 2]
    envs.set_attr("t", 9, indices=-1)  # -1: the last env, as in SB3
    envs.set_attr("t", 7, indices=[0, 1])
    assert envs.get_attr("t") == [7, 7, 0, 9]
    assert envs.get_attr("length", indices=2) == [4]
    assert envs.has_attr("length") and not envs.has_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="no_such_attribute"):
        envs.get_attr("no_such_attribute")
    assert envs.env_is_wrapped(Monitor) == [True] * NUM_ENVS
    assert envs.env_is_wrapped(TimeLimit, indices=[1]) == [True]
    assert envs.env_is_wrapped(gym.wrappers.ClipAction) == [False] * NUM_ENVS
    with pytest.raises(IndexError, match="env index 4"):
        envs.get_attr("t", indices=[4])


def test_render_tiles_each_envs_frame(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec(counting_env_fns(render_mode="rgb_array"))
    assert envs.render_mode == "rgb_array"
    envs.reset()
    envs.step(np.zeros(NUM_ENVS, np.int64))
    frames = [np.asarray(frame) for frame in envs.get_images()]
    assert [frame.tolist() for frame in frames] == [np.full((2, 3, 3), 1, np.uint8).tolist()] * NUM_ENVS
    assert np.asarray(envs.render()).shape == (4, 6, 3)  # 4 frames of 2x3, tiled 2 by 2


def test_dict_actions_one_per_env(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec([DictActionEnv, DictActionEnv])
    envs.reset()
    actions = [{"a": 1, "b": np.array([0.5, 0.25], np.float32)}, {"a": 3, "b": np.zeros(2, np.float32)}]
    obs, _, _, _ = envs.step(actions)  # SB3 indexes actions per env: a list of dicts
    assert obs.tolist() == [[1, 0.5, 0.25], [3, 0, 0]]
    with pytest.raises(ValueError, match="2 actions, one per env, got 1"):
        envs.step_async(actions[:1])


def test_step_wait_needs_step_async(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec(counting_env_fns())
    envs.reset()
    with pytest.raises(NoAsyncCallError):
        envs.step_wait()
    envs.step_async(np.zeros(NUM_ENVS, np.int64))
    envs.reset()  # drops the step, as SB3 says a reset does
    with pytest.raises(NoAsyncCallError):
        envs.step_wait()


def test_a_factory_returning_one_env_twice_is_refused(executor: str) -> None:
    env = CountingEnv()
    with pytest.raises(EnvError, match="another factory returned too"):
        VecEnv([lambda: env, lambda: env], executor=executor, envs_per_worker=2)


def test_gymnasium_ids(make_vec: Callable[..., VecEnv]) -> None:
    envs = make_vec(["CartPole-v1"] * 2)
    envs.seed(0)
    assert envs.reset().shape == (2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["inline", "process"])
def test_ppo_learns_under_vec_normalize(executor: str) -> None:
    envs = sb3.VecNormalize(VecEnv(["CartPole-v1"] * 4, executor=executor))
    model = PPO("MlpPolicy", envs, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=512)
    assert model.num_timesteps == 512
    assert isinstance(envs.obs_rms, RunningMeanStd) and envs.obs_rms.count > 512  # it saw every step
    envs.close()


def test_import_without_sb3_says_what_to_install() -> None:
    code = "import sys; sys.modules['stable_baselines3'] = None; import aenvs.sb3"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "pip install 'aenvs[sb3]'" in result.stderr

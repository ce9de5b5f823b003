"""The sync shim's TorchRL surface: construction, reset / step / rollout, seeding,
attribute forwarding and the non-awaitable split-phase calls, on every executor."""

from __future__ import annotations

import os
from typing import cast

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvBusyError, ParallelEnv, PoolClosedError, SerialEnv, step_mdp
from aenvs._seeding import seed_chain
from aenvs.testing import EchoEnv, echo_env_fns
from tests.sync.sync_envs import ValEnv, marking_env_fn, wait_for_files


def _row(td: TensorDictBase, index: int) -> TensorDictBase:
    return cast(TensorDictBase, td[index])


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


# -- construction -------------------------------------------------------------------------------


def test_serial_and_parallel_pick_their_executors() -> None:
    with SerialEnv(2, cartpole) as serial:
        assert serial.pool.executor.name == "inline"
    with ParallelEnv(2, cartpole) as parallel:
        assert parallel.pool.executor.name == "process"
        assert parallel.reset()["observation"].shape == (2, 4)
    with ParallelEnv(2, cartpole, executor="thread") as threaded:
        assert threaded.pool.executor.name == "thread"


def test_torchrl_arguments(executor: str) -> None:
    def make(level: int = 0, speed: float = 1.0) -> ValEnv:
        env = ValEnv(groups=())
        env.g = level * speed
        return env

    # TorchRL's positional order: num_workers, create_env_fn, create_env_kwargs
    with SerialEnv(2, make, {"level": 3}, executor=executor) as env:
        assert env.g == [3.0, 3.0]
    with SerialEnv(2, [make, make], [{"level": 1}, {"level": 2, "speed": 2.0}], executor=executor) as env:
        assert env.g == [1.0, 4.0]
    with SerialEnv(2, "CartPole-v1", {"max_episode_steps": 7}, executor=executor) as env:
        assert env.get_attr("_max_episode_steps") == [7, 7]
    # TorchRL options that mean nothing here are accepted
    with SerialEnv(
        1, make, shared_memory=True, mp_start_method="fork", device="cpu", executor=executor
    ) as env:
        assert len(env) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_workers=3 but 2 create_env_fn"):
        SerialEnv(3, [cartpole, cartpole])
    with pytest.raises(ValueError, match="2 create_env_kwargs"):
        SerialEnv(3, cartpole, [{}, {}])
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        SerialEnv(2, cartpole, frobnicate=True)
    with pytest.raises(ValueError, match="device"):
        SerialEnv(2, cartpole, device="cuda")


# -- the batched-env surface ----------------------------------------------------------------------


def test_surface(executor: str) -> None:
    env = SerialEnv(3, cartpole, executor=executor)
    with env:
        assert env.batch_size == torch.Size([3])
        assert env.num_workers == len(env) == env.num_envs == 3
        assert env.observation_space == gym.make("CartPole-v1").observation_space
        assert env.action_space == gym.spaces.Discrete(2)
        assert [s.action_space for s in env.env_specs] == env.action_spaces == [gym.spaces.Discrete(2)] * 3
        assert not env.is_closed and "running" in repr(env)
        td = env.reset()
        assert td.batch_size == (3,) and td["observation"].dtype == torch.float32
        action = env.rand_action()
        assert action["action"].shape == (3,) and action["action"].dtype == torch.int64
        td = env.rand_action(td)  # in place, as TorchRL
        assert "action" in td.keys()
        out = env.step(td)
        assert out["next", "reward"].shape == (3, 1)
        assert torch.equal(td["next", "observation"], out["next", "observation"])  # written into td too
        out = env.rand_step(step_mdp(out))
        assert out["next", "done"].shape == (3, 1)
        out, nxt = env.step_and_maybe_reset(env.rand_action(step_mdp(out)))
        assert "reward" in out.get("next").keys() and "reward" not in nxt.keys()
    assert env.is_closed and "closed" in repr(env)
    env.close()  # idempotent
    with pytest.raises(PoolClosedError):
        env.close(raise_if_closed=True)
    with pytest.raises(PoolClosedError):
        env.reset()


def test_rollout(executor: str) -> None:
    with SerialEnv(2, echo_env_fns(2, episode_length=3)[0], executor=executor) as env:

        def policy(td: TensorDict) -> None:
            td["action"] = torch.full((2, 1), 2.0, dtype=torch.float64)

        traj = env.rollout(10, policy)  # break_when_any_done by default
        assert traj.batch_size == (2, 3) and traj.names == [None, "time"]
        assert traj["next", "done"][:, -1].all() and not traj["next", "done"][:, :-1].any()
        assert traj["next", "reward"].sum().item() == 12.0

        traj = env.rollout(7, policy, break_when_any_done=False)
        assert traj.batch_size == (2, 7)
        assert traj["next", "observation"][0, :, 2].tolist() == [1, 2, 3, 1, 2, 3, 1]  # done envs were reset

        seen = []
        td = env.reset()
        traj = env.rollout(2, policy, lambda e, td: seen.append(e), auto_reset=False, tensordict=td)
        assert traj.batch_size == (2, 2) and seen == [env, env]
        with pytest.raises(RuntimeError, match="auto_reset=False"):
            env.rollout(2, policy, auto_reset=False)
        with pytest.raises(TypeError):
            env.rollout(2, policy, break_when_any_done=True, break_when_all_done=True)


def test_rollout_with_random_actions_and_cartpole(executor: str) -> None:
    with SerialEnv(4, cartpole, executor=executor) as env:
        env.set_seed(0)
        traj = env.rollout(50, break_when_any_done=False)
        assert traj.batch_size == (4, 50) and traj.names == [None, "time"]
        assert traj["action"].dtype == torch.int64
        assert set(traj["action"].unique().tolist()) <= {0, 1}


def test_set_seed_follows_the_torchrl_chain(executor: str) -> None:
    with SerialEnv(3, cartpole, executor=executor) as env:
        assert env.set_seed(11) == seed_chain(11, 3)[1]
        first = env.reset()["observation"]
        assert env.set_seed(None) is None
        env.set_seed(11)
        assert torch.equal(env.reset()["observation"], first)
        reference = gym.make("CartPole-v1")
        reference.reset(seed=seed_chain(11, 3)[0][1])  # env 1 got the chain's second seed
        obs, _ = reference.reset()
        assert torch.equal(first[1], torch.as_tensor(obs))


def test_seeded_rollouts_are_reproducible(executor: str) -> None:
    def run() -> TensorDict:
        with SerialEnv(2, cartpole, executor=executor) as env:
            env.set_seed(3)
            torch.manual_seed(0)
            return env.rollout(30, break_when_any_done=False)

    a, b = run(), run()
    assert torch.equal(a["next", "observation"], b["next", "observation"])
    assert torch.equal(a["action"], b["action"])


# -- attribute forwarding -----------------------------------------------------------------------------


def test_attribute_forwarding(executor: str) -> None:
    with SerialEnv(3, lambda: ValEnv(groups=()), executor=executor) as env:
        a, b, c = env.g
        assert (a, b, c) == (9.81, 9.81, 9.81)
        td = env.reset()
        td["action"] = torch.tensor([[1.0], [2.0], [3.0]])
        env.step(td)
        assert env.scaled(10) == [[10.0], [20.0], [30.0]]  # a method: called on every env
        env.set_attr("g", 1.5)
        assert env.g == [1.5] * 3
        assert env.call("scaled", 2, env_index=[2]) == [[6.0]]
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            _ = env.nope
        with pytest.raises(AttributeError):
            _ = env._private


def test_gymnasium_attributes_are_forwarded_through_wrappers(executor: str) -> None:
    with SerialEnv(2, cartpole, executor=executor) as env:
        assert env.gravity == [9.8, 9.8]
        assert env.get_wrapper_attr("gravity") == [9.8, 9.8]


# -- split-phase, not awaitable ------------------------------------------------------------------------


def test_split_phase_calls(executor: str) -> None:
    with SerialEnv(3, echo_env_fns(3)[0], executor=executor) as env:
        env.reset()
        env.async_step_send(
            TensorDict(action=torch.tensor([[1.0], [2.0]], dtype=torch.float64), batch_size=[2]), [0, 2]
        )
        out = env.async_step_recv(min_get=2)
        assert sorted(out["env_index"].tolist()) == [0, 2]
        with pytest.raises(ValueError, match="would wait forever"):
            env.async_step_recv()
        env.async_reset_send(env_index=[1])
        reset = env.async_reset_recv(env_index=1)
        assert reset["env_index"].tolist() == [1]
        td = TensorDict(action=torch.ones(3, 1, dtype=torch.float64), batch_size=[3])
        env.async_step_and_maybe_reset_send(td)
        out, nxt = env.async_step_and_maybe_reset_recv(min_get=3)
        assert out.batch_size == (3,) and nxt.batch_size == (3,)
        env.async_step_send(td)
        with pytest.raises(EnvBusyError):
            env.async_step_send(td)
        assert env.async_step_recv(min_get=3, timeout=30).batch_size == (3,)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_envs_progress_while_the_loop_is_idle(executor: str, tmp_path) -> None:
    """Between sync calls the private loop does not run; thread and process workers step anyway,
    and the next call picks their results up at once."""
    with SerialEnv(3, marking_env_fn(str(tmp_path)), executor=executor) as env:
        assert env.loop_driver.kind == "private"
        env.reset()
        env.async_step_send(TensorDict(action=torch.ones(3, 1, dtype=torch.float64), batch_size=[3]))
        assert wait_for_files([os.path.join(tmp_path, f"stepped-{i}-1") for i in range(3)])
        out = env.async_step_recv(min_get=3, timeout=5)
        assert out["next", "observation"][:, 2].tolist() == [1.0, 1.0, 1.0]


def test_heterogeneous_envs_stack_lazily() -> None:
    with SerialEnv(2, ["CartPole-v1", "Pendulum-v1"]) as env:
        with pytest.raises(ValueError, match="different observation_spaces"):
            _ = env.observation_space
        traj = env.rollout(5, break_when_any_done=False)
        assert traj.batch_size == (2, 5)
        assert _row(traj, 1)["action"].shape == (5, 1) and _row(traj, 0)["action"].shape == (5,)


def test_native_env_factory_list() -> None:
    with SerialEnv(2, [lambda: EchoEnv(0), lambda: EchoEnv(5)]) as env:
        assert env.reset()["observation"][:, 0].tolist() == [0.0, 5.0]

"""``aenvs.torchrl.SerialEnv`` / ``ParallelEnv`` in place of TorchRL's, on every executor: the
same script lines give the same rollouts under the same seeds, the same specs, and run
TorchRL's transforms and collector."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.torchrl.support import collector_class, import_torchrl

pytestmark = pytest.mark.torchrl

N, STEPS, SEED = 2, 12, 5
SPECS = ("full_observation_spec", "full_action_spec", "full_reward_spec", "full_done_spec", "full_state_spec")


def _cartpole() -> Any:
    return import_torchrl("torchrl.envs").GymEnv("CartPole-v1")


# TorchRL's mock envs set up their specs on the class while one is made: made one at a time
# (the thread executor makes its envs concurrently)
_MAKING = threading.Lock()


class _Mock:
    """A factory of TorchRL's mock env ``name`` (a top-level class: pickled by reference)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self) -> Any:
        with _MAKING:
            return getattr(import_torchrl("torchrl.testing.mocking_classes"), self.__name__)()


ROLLOUT_MEMBERS = [_cartpole, _Mock("ContinuousActionVecMockEnv")]
# the mock envs draw their observations from torch's global generator: the test's (seeded
# below) only where the members run one after the other in this process
IN_PROCESS = ("inline",)
SPEC_MEMBERS = [*ROLLOUT_MEMBERS, _Mock("NestedCountingEnv"), _Mock("MultiKeyCountingEnv")]


def _ours(name: str) -> Any:
    return getattr(import_torchrl("aenvs.torchrl"), name)


def _theirs(name: str) -> Any:
    return getattr(import_torchrl("torchrl.envs"), name)


def _rollout(env: Any) -> Any:
    env.set_seed(SEED)
    torch.manual_seed(SEED)  # the random actions
    return env.rollout(STEPS, break_when_any_done=False)


@pytest.mark.parametrize("make", ROLLOUT_MEMBERS, ids=lambda f: f.__name__)
def test_same_rollout_as_torchrl(executor: str, make: Callable[[], Any]) -> None:
    theirs = _theirs("SerialEnv")(N, make)
    expected = _rollout(theirs)
    theirs.close()
    ours = _ours("SerialEnv")(N, make, executor=executor)
    got = _rollout(ours)
    ours.close()
    assert got.batch_size == expected.batch_size == torch.Size([N, STEPS])
    assert set(got.keys(True, True)) == set(expected.keys(True, True))  # no "env_index", no extras
    for key in expected.keys(True, True):
        assert got[key].shape == expected[key].shape and got[key].dtype == expected[key].dtype, key
        if make is _cartpole or executor in IN_PROCESS:
            assert torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("make", SPEC_MEMBERS, ids=lambda f: f.__name__)
def test_specs_as_torchrl(executor: str, make: Callable[[], Any]) -> None:
    theirs = _theirs("SerialEnv")(N, make)
    ours = _ours("ParallelEnv")(N, make, executor=executor)
    assert ours.batch_size == theirs.batch_size
    for name in SPECS:
        assert getattr(ours, name) == getattr(theirs, name), name
    ours.close(raise_if_closed=False)
    theirs.close(raise_if_closed=False)


@pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater which inherits:DeprecationWarning")
def test_transformed_env_and_collector(executor: str) -> None:
    envs = import_torchrl("torchrl.envs")
    env = envs.TransformedEnv(
        _ours("SerialEnv")(N, _cartpole, executor=executor), envs.StepCounter(max_steps=5)
    )
    collector = collector_class()(env, None, frames_per_batch=N * 8, total_frames=N * 16)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    assert batches[0].batch_size == torch.Size([N, 8])
    assert int(batches[0]["next", "step_count"].max()) <= 5


def test_reset_after_close(executor: str) -> None:
    env = _ours("SerialEnv")(N, _cartpole, executor=executor)
    first = env.reset()
    env.close()
    assert env.is_closed
    again = env.reset()  # restarts the workers, as TorchRL's batched envs do
    assert again["observation"].shape == first["observation"].shape == torch.Size([N, 4])
    env.close()


def test_torchrl_errors(executor: str) -> None:
    serial = _ours("SerialEnv")
    with pytest.raises(RuntimeError, match="len\\(create_env_fn\\) and num_workers mismatch"):
        serial(3, [_cartpole, _cartpole], executor=executor)
    with pytest.raises(RuntimeError, match="len\\(create_env_kwargs\\) and num_workers mismatch"):
        serial(2, _cartpole, create_env_kwargs=[{}], executor=executor)
    with pytest.raises(TypeError, match="mp_start_method"):
        serial(2, _cartpole, mp_start_method="fork", executor=executor)


def test_partial_reset_and_step(executor: str) -> None:
    env = _ours("SerialEnv")(N, _cartpole, executor=executor, shared_memory=True, use_buffers=True)
    td = env.reset()
    td["_reset"] = torch.tensor([[True], [False]])
    out = env.reset(td.clone())
    assert torch.equal(out["observation"][1], td["observation"][1])  # env 1 left as it was
    td = env.rand_action(out)
    td["_step"] = torch.tensor([True, False])
    stepped = env.step(td)
    assert torch.equal(stepped["next", "observation"][1], out["observation"][1])
    assert not torch.equal(stepped["next", "observation"][0], out["observation"][0])
    env.close()


def _gym_cartpole() -> Any:
    import gymnasium

    return gymnasium.make("CartPole-v1")


@pytest.mark.parametrize("members", [_gym_cartpole, "CartPole-v1"], ids=["gymnasium-env", "gymnasium-id"])
def test_gymnasium_members(executor: str, members: Any) -> None:
    from aenvs.torchrl import SerialEnv

    env = SerialEnv(2, members, executor=executor)
    try:
        td = env.rollout(5, break_when_any_done=False)
        assert td.batch_size == torch.Size([2, 5])
        assert td["next", "observation"].shape == (2, 5, 4) and "env_index" not in td.keys()
        env.close()
        assert env.reset().batch_size == torch.Size([2])  # restarted after close
    finally:
        env.close()

"""TorchRL envs as pool members keep what TorchRL gives them: nested actions of a shaped
sub-TensorDict, nested rewards and done flags, envs without a reward, observations that carry
gradients; on every executor."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl


def _mocks() -> Any:
    return import_torchrl("torchrl.testing.mocking_classes")


def _nested_counting() -> Any:
    return _mocks().NestedCountingEnv(nested_dim=5)


def _multi_key() -> Any:
    return _mocks().MultiKeyCountingEnv()


def _does_nothing() -> Any:
    return _mocks().EnvThatDoesNothing()


async def test_nested_rewards_and_flags_keep_their_keys_and_shapes(make_pool) -> None:
    """NestedCountingEnv: ("data", "action") is [5, 1] (not Binary(1)'s [1]); its reward and
    done flags live under "data", [5, 1] each, and come back there."""
    pool = await make_pool([_nested_counting] * 2)
    td = await pool.reset()
    assert td["data", "states"].shape == (2, 5, 1)
    assert td["data", "reward"].shape == (2, 5, 1)  # zeros at a reset
    td["action", "data", "action"] = torch.ones(2, 5, 1, dtype=torch.int8)
    for step in range(1, 3):
        out = await pool.step(td)
        assert (out["next", "data", "states"] == step).all()
        assert out["next", "data", "reward"].shape == (2, 5, 1)
        assert out["next", "data", "done"].dtype == torch.bool
        assert out["next", "data", "done"].shape == (2, 5, 1)


async def test_several_nested_actions_and_rewards(make_pool) -> None:
    """MultiKeyCountingEnv: a [3] categorical action under "nested_1" (MultiDiscrete, not
    Discrete), a root one-hot action taken as an index, rewards at three keys."""
    pool = await make_pool([_multi_key] * 2)
    space = pool.env_specs[0].action_space
    assert space["nested_1"]["action"].shape == (3,)
    td = await pool.reset()
    td["action", "action"] = torch.tensor([1, 0])
    td["action", "nested_1", "action"] = torch.ones(2, 3, dtype=torch.int64)
    td["action", "nested_2", "azione"] = torch.ones(2, 2, 1)
    out = await pool.step(td)
    assert out["next", "nested_1", "gift"].shape == (2, 3, 1)
    assert out["next", "nested_2", "reward"].shape == (2, 2, 1)
    assert out["next", "reward"].shape == (2, 1)


async def test_an_env_without_a_reward_steps(make_pool) -> None:
    pool = await make_pool([_does_nothing] * 2)
    await pool.reset()
    out = await pool.step(pool.rand_action())
    assert (out["next", "reward"] == 0).all()
    assert not out["next", "done"].any()


@pytest.mark.parametrize("executor", ["inline", "thread"])
async def test_observations_with_gradients_are_sent_detached(make_pool) -> None:
    """An env whose observations require grad (TorchRL's test_backprop env) runs in a pool:
    its values arrive detached (a pool's batch holds values, not the graph)."""
    envs, data = import_torchrl("torchrl.envs"), import_torchrl("torchrl.data")
    tensordict = import_torchrl("tensordict")

    class Differentiable(envs.EnvBase):
        def __init__(self) -> None:
            super().__init__()
            self.observation_spec = data.Composite(observation=data.Unbounded(3))
            self.action_spec = data.Composite(action=data.Unbounded(3))
            self.reward_spec = data.Composite(reward=data.Unbounded(1))

        def _set_seed(self, seed: int | None) -> None:
            pass

        def _reset(self, td: Any) -> Any:
            out = self.observation_spec.zero().update(self.done_spec.zero())
            out["observation"] = (out["observation"] + 1).requires_grad_()
            return out

        def _step(self, td: Any) -> Any:
            action = td["action"]
            return tensordict.TensorDict(
                {
                    "reward": action.sum().unsqueeze(0),
                    **self.full_done_spec.zero(),
                    "observation": td["observation"] + action,
                },
                batch_size=[],
            )

    pool = await make_pool([Differentiable] * 2)
    td = await pool.reset()
    assert not td["observation"].requires_grad
    td["action"] = torch.ones(2, 3)
    out = await pool.step(td)
    assert (out["next", "observation"] == 2).all()
    assert (out["next", "reward"] == 3).all()


def _history() -> Any:
    """CountingEnv with TorchRL's HistoryTransform: a tensorclass observation of non-tensor
    stacks that the env reads back (``unbind``) at its next step."""
    mocks = _mocks()
    return mocks.CountingEnv(max_steps=10).append_transform(mocks.HistoryTransform())


async def test_a_tensorclass_history_read_back_at_each_step(make_pool) -> None:
    """The env's next input keeps its tensorclass entry as TorchRL's rollouts keep it (its
    non-tensor stacks stay stacks, which the env unbinds), step after step."""
    pool = await make_pool([_history] * 2)
    td = await pool.reset()
    td["action"] = torch.ones(2, 1, dtype=torch.int8)
    for step in range(1, 4):
        out = await pool.step(td)
        assert (out["next", "observation"] == step).all()


def _batched_nested_only() -> Any:
    """A [4]-batched NestedCountingEnv whose reward and done flags are all under "data"."""
    return _mocks().NestedCountingEnv(
        nest_reward=True, nest_done=True, batch_size=(4,), nested_dim=5, max_steps=2
    )


async def test_a_batched_env_with_nested_rewards_and_flags_only(make_pool) -> None:
    """Its nested reward and flags come back at their keys ([2, 4, 5, 1]); the root reward is
    zeros and a sub-env is done when any of its nested flags is."""
    pool = await make_pool([_batched_nested_only] * 2)
    td = await pool.reset()
    assert td["data", "done"].shape == (2, 4, 5, 1)
    td["action", "data", "action"] = torch.ones(2, 4, 5, 1, dtype=torch.int8)
    for _ in range(3):
        out = await pool.step(td)
        nxt = out["next"]
        assert nxt["data", "reward"].shape == (2, 4, 5, 1)
        assert (nxt["reward"] == 0).all() and nxt["reward"].shape == (2, 4, 1)
        assert (nxt["done"] == nxt["data", "done"].reshape(2, 4, -1).any(-1, keepdim=True)).all()
    assert nxt["done"].all()  # three steps past max_steps=2


def _batched_multi_key() -> Any:
    return _mocks().MultiKeyCountingEnv(batch_size=(3,))


async def test_a_batched_env_keeps_its_nested_rewards(make_pool) -> None:
    """A [3]-batched MultiKeyCountingEnv: its ("nested_1", "gift") reward is in the pool's
    output at its key, with the sub-envs' shape ([2, 3, 3, 1])."""
    pool = await make_pool([_batched_multi_key] * 2)
    td = await pool.reset()
    td["action", "action"] = torch.zeros(2, 3, dtype=torch.int64)
    td["action", "nested_1", "action"] = torch.ones(2, 3, 3, dtype=torch.int64)
    td["action", "nested_2", "azione"] = torch.ones(2, 3, 2, 1)
    out = await pool.step(td)
    assert out["next", "nested_1", "gift"].shape == (2, 3, 3, 1)
    assert out["next", "nested_2", "reward"].shape == (2, 3, 2, 1)
    assert out["next", "reward"].shape == (2, 3, 1)

"""Partial steps ("_step") and partial resets ("_reset"): every worked case of
shared/reference/partial-resets.md, with exact expected tensors, on every executor."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import SerialEnv, step_mdp
from aenvs.testing import EchoEnv, echo_env_fns
from tests.sync.sync_envs import ValEnv

T, F = True, False


def _row(td: TensorDictBase, index: int) -> TensorDictBase:
    return cast(TensorDictBase, td[index])


def _mask_keys(td: TensorDictBase) -> list:
    return [
        k for k in td.keys(include_nested=True) if (k if isinstance(k, str) else k[-1]) in ("_reset", "_step")
    ]


def _root_val_env() -> ValEnv:
    return ValEnv(groups=())


def _group_env() -> ValEnv:
    return ValEnv()


def _vals(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1)


# -- partial resets: the worked cases ---------------------------------------------------------


@pytest.mark.parametrize("mask_shape", ["done-shaped", "batch-shaped"])
def test_root_only(executor: str, mask_shape: str) -> None:
    with SerialEnv(2, _root_val_env, executor=executor) as env:
        env.reset()
        mask = torch.tensor([F, T])
        td = TensorDict(
            {"val": _vals([1, 1]), "_reset": mask.unsqueeze(-1) if mask_shape == "done-shaped" else mask}, [2]
        )
        out = env.reset(td)
        assert torch.equal(out["val"], _vals([1, 0]))
        assert not _mask_keys(out)
        assert env.resets == [1, 2]  # env 0 was not reset


def test_nested_per_group(executor: str) -> None:
    with SerialEnv(2, _group_env, executor=executor) as env:
        env.reset()
        td = TensorDict(
            {
                "agent0": {"val": _vals([1, 1]), "_reset": torch.tensor([F, T])},
                "agent1": {"val": _vals([2, 2]), "_reset": torch.tensor([T, F])},
            },
            [2],
        )
        out = env.reset(td)
        assert torch.equal(out["agent0", "val"], _vals([1, 0]))
        assert torch.equal(out["agent1", "val"], _vals([0, 2]))
        assert not _mask_keys(out)
        assert not _mask_keys(td.exclude("agent0", "agent1"))
        # each env was told which of its groups to reset
        options = env.last_options
        assert [bool(o["_reset"]["agent0"]["_reset"].item()) for o in options] == [F, T]
        assert [bool(o["_reset"]["agent1"]["_reset"].item()) for o in options] == [T, F]
        # the env reset only those groups itself, too
        assert env.vals == [{"agent0": 0.0, "agent1": 0.0}] * 2


def test_root_overrides_nested(executor: str) -> None:
    with SerialEnv(2, _group_env, executor=executor) as env:
        env.reset()
        td = TensorDict(
            {
                "agent0": {"val": _vals([1, 1]), "_reset": torch.tensor([F, T])},
                "agent1": {"val": _vals([2, 2]), "_reset": torch.tensor([T, F])},
                "_reset": torch.tensor([[T], [T]]),
            },
            [2],
        )
        out = env.reset(td)
        assert torch.equal(out["agent0", "val"], _vals([0, 0]))
        assert torch.equal(out["agent1", "val"], _vals([0, 0]))
        assert not _mask_keys(out)
        assert env.last_options == [None, None]  # a whole reset: no group masks


def test_batch_of_four(executor: str) -> None:
    with SerialEnv(4, echo_env_fns(4)[0], executor=executor) as env:
        td = env.reset()
        td["action"] = torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
        td = step_mdp(env.step(td))
        td["_reset"] = torch.tensor([[T], [F], [T], [T]])
        out = env.reset(td)
        expected = torch.tensor(
            [[0.0, 0.0, 0.0], [1.0, 2.0, 1.0], [2.0, 0.0, 0.0], [3.0, 0.0, 0.0]], dtype=torch.float64
        )
        assert torch.equal(out["observation"], expected)
        for key in ("done", "terminated", "truncated"):
            assert out[key].shape == (4, 1) and out[key].dtype == torch.bool
            assert not out[key].any()
        assert set(out.keys()) == {"observation", "done", "terminated", "truncated", "env_index"}
        assert out["env_index"].tolist() == [0, 1, 2, 3]
        assert env.resets == [2, 1, 2, 2]  # env 1 was left alone


# -- partial resets: the other rules ----------------------------------------------------------


def test_reset_beside_no_done_is_an_error(executor: str) -> None:
    with SerialEnv(2, _group_env, executor=executor) as env:
        env.reset()
        td = TensorDict({"elsewhere": {"_reset": torch.tensor([T, F])}}, [2])
        with pytest.raises(ValueError, match=r"'elsewhere._reset' has no 'done' beside it"):
            env.reset(td)
        with pytest.raises(TypeError, match="must be a bool tensor"):
            env.reset(TensorDict({"_reset": torch.ones(2, 1)}, [2]))
        assert env.rollout(2, break_when_any_done=False).batch_size == (2, 2)  # still usable


def test_entries_the_reset_does_not_give(executor: str) -> None:
    """As TorchRL: zeroed where the reset applies (the reset did not keep them), kept elsewhere;
    a reset of every env keeps them."""
    with SerialEnv(3, _root_val_env, executor=executor) as env:
        td = env.reset()
        td["val"] = _vals([5, 6, 7])
        td["memo"] = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        td["_reset"] = torch.tensor([[T], [F], [F]])
        out = env.reset(td)
        assert torch.equal(out["val"], _vals([0, 6, 7]))
        assert torch.equal(out["memo"], torch.tensor([[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]]))
        td["_reset"] = torch.tensor([[T], [T], [T]])
        out = env.reset(td)
        assert torch.equal(out["val"], _vals([0, 0, 0]))
        assert torch.equal(out["memo"], td["memo"])


def test_no_env_marked_resets_nothing(executor: str) -> None:
    with SerialEnv(2, _root_val_env, executor=executor) as env:
        env.reset()
        td = TensorDict({"val": _vals([1, 2]), "_reset": torch.tensor([[F], [F]])}, [2])
        out = env.reset(td)
        assert torch.equal(out["val"], _vals([1, 2])) and not _mask_keys(out)
        assert env.resets == [1, 1]


def test_group_reset_of_live_envs_keeps_the_other_groups(executor: str) -> None:
    """Real data: step both envs, then reset agent1 of env 0 only."""
    with SerialEnv(2, _group_env, executor=executor) as env:
        td = env.reset()
        td["action"] = torch.tensor([[1.0], [2.0]])
        td = step_mdp(env.step(td))
        td["agent1", "_reset"] = torch.tensor([[T], [F]])
        td["agent0", "_reset"] = torch.tensor([[F], [F]])
        out = env.reset(td)
        assert torch.equal(out["agent0", "val"], _vals([1, 2]))
        assert torch.equal(out["agent1", "val"], _vals([0, 2]))
        assert env.vals == [{"agent0": 1.0, "agent1": 0.0}, {"agent0": 2.0, "agent1": 2.0}]


# -- partial steps ------------------------------------------------------------------------------


def test_partial_step_steps_only_the_marked_envs(executor: str) -> None:
    with SerialEnv(3, echo_env_fns(3)[0], executor=executor) as env:
        td = env.reset()
        td["action"] = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
        td["_step"] = torch.tensor([T, F, T])
        out = env.step(td)
        expected = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [2.0, 3.0, 1.0]], dtype=torch.float64)
        assert torch.equal(out["next", "observation"], expected)  # env 1: its input observation
        assert torch.equal(out["next", "reward"], torch.tensor([[1.0], [0.0], [3.0]]))  # 0: not in input
        assert torch.equal(out["observation"], td["observation"])  # the input at the root
        assert not out["next", "done"].any()
        assert not _mask_keys(out)
        assert env.steps == [1, 0, 1]


def test_partial_step_takes_input_values_where_present(executor: str) -> None:
    with SerialEnv(2, echo_env_fns(2)[0], executor=executor) as env:
        td = env.reset()
        td["action"] = torch.ones(2, 1, dtype=torch.float64)
        td["reward"] = torch.tensor([[7.0], [8.0]])
        td["done"] = torch.tensor([[F], [T]])
        td["_step"] = torch.tensor([[T], [F]])  # [B, 1] is accepted too
        out = env.step(td)
        assert torch.equal(out["next", "reward"], torch.tensor([[1.0], [8.0]]))
        assert out["next", "done"].view(-1).tolist() == [F, T]


def test_partial_step_of_nothing_and_of_everything(executor: str) -> None:
    with SerialEnv(2, echo_env_fns(2)[0], executor=executor) as env:
        td = env.reset()
        td["action"] = torch.ones(2, 1, dtype=torch.float64)
        td["_step"] = torch.tensor([F, F])
        out = env.step(td)
        assert torch.equal(out["next", "observation"], td["observation"])
        assert env.steps == [0, 0]
        td["_step"] = torch.tensor([T, T])
        out = env.step(td)
        assert env.steps == [1, 1] and not _mask_keys(out)


def test_partial_step_and_maybe_reset(executor: str) -> None:
    with SerialEnv(3, echo_env_fns(3, episode_length=1)[0], executor=executor) as env:
        td = env.reset()
        td["action"] = torch.ones(3, 1, dtype=torch.float64)
        td["_step"] = torch.tensor([T, F, F])
        td["done"] = torch.tensor([[F], [F], [T]])  # env 2 is not stepped but its input is done
        out, nxt = env.step_and_maybe_reset(td)
        assert out["next", "done"].view(-1).tolist() == [T, F, T]
        assert env.steps == [0, 0, 0]  # env 0 stepped (episode of 1) and was reset
        assert env.resets == [2, 1, 2]  # env 2: reset because its carried input is done
        assert not nxt["done"].any()
        assert not _mask_keys(out) and not _mask_keys(nxt)
        assert nxt["env_index"].tolist() == [0, 1, 2]


def test_rollout_break_when_all_done_uses_partial_steps(executor: str) -> None:
    def make(ctx) -> EchoEnv:
        return EchoEnv(env_index=ctx.env_index, episode_length=ctx.env_index + 2)

    with SerialEnv(3, make, executor=executor) as env:
        traj = env.rollout(
            10,
            policy=lambda td: td.set("action", torch.ones(3, 1, dtype=torch.float64)),
            break_when_all_done=True,
        )
        assert traj.batch_size == (3, 4) and traj.names == [None, "time"]
        # each env stepped until done, then repeated its last transition
        assert traj["next", "observation"][:, :, 2].tolist() == [[1, 2, 2, 2], [1, 2, 3, 3], [1, 2, 3, 4]]
        assert traj["next", "done"][:, :, 0].tolist() == [[F, T, T, T], [F, F, T, T], [F, F, F, T]]
        assert env.steps == [2, 3, 4]


# -- heterogeneous envs (lazy stacks) -------------------------------------------------------------


def test_partial_step_and_reset_of_different_envs() -> None:
    with SerialEnv(2, ["CartPole-v1", "Pendulum-v1"], stack="lazy") as env:
        td = env.reset()
        td = env.rand_action(td)
        td["_step"] = torch.tensor([F, T])
        out = env.step(td)
        assert torch.equal(_row(out, 0)["next", "observation"], _row(td, 0)["observation"])
        assert not torch.equal(_row(out, 1)["next", "observation"], _row(td, 1)["observation"])
        assert not _mask_keys(out)
        nxt = step_mdp(out)
        nxt["_reset"] = torch.tensor([[T], [F]])
        reset = env.reset(nxt)
        assert torch.equal(_row(reset, 1)["observation"], _row(nxt, 1)["observation"])
        assert _row(reset, 0)["observation"].shape == (4,)
        assert not _mask_keys(reset)

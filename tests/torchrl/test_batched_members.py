"""TorchRL envs with a batch size of their own (``[3]``) as pool members, on every executor:
the pool's batch is ``[num_envs, 3]`` and every value matches TorchRL's own ``SerialEnv`` of
the same envs under the same seeds, partial resets within a member included."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvError, SerialEnv
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N, SUB, STEPS, SEED = 2, 3, 14, 7
_KEYS = ("reward", "done", "terminated", "truncated", "observation")


def _countdown():
    import_torchrl()
    from tests.torchrl.envs import CountdownEnv

    return CountdownEnv()


def _cartpole():
    return import_torchrl("torchrl.envs").GymEnv("CartPole-v1")


def _actions() -> torch.Tensor:
    return torch.randint(0, 3, (STEPS, N, SUB), generator=torch.Generator().manual_seed(3))


def _record(out: TensorDictBase, nxt: TensorDictBase) -> dict[str, torch.Tensor]:
    done = out["next", "done"]  # TorchRL's env has no "truncated": never set, as the pool has it
    row = {key: out.get(("next", key), torch.zeros_like(done)).clone() for key in _KEYS}
    row["reset_observation"] = nxt["observation"].clone()
    return row


def _torchrl_run(actions: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    envs = import_torchrl("torchrl.envs")
    serial = envs.SerialEnv(N, _countdown)
    try:
        serial.set_seed(SEED)
        td = serial.reset()
        first = td["observation"].clone()
        rows = []
        for t in range(len(actions)):
            td["action"] = actions[t]
            out, td = serial.step_and_maybe_reset(td)
            rows.append(_record(out, td))
        return first, rows
    finally:
        serial.close()


async def test_batched_members_step_and_reset_as_torchrl_serial_env(make_pool) -> None:
    actions = _actions()
    first, expected = _torchrl_run(actions)
    pool = await make_pool([_countdown] * N)
    assert pool.batch_size == torch.Size([N, SUB])
    assert pool.env_specs[0].batch_shape == (SUB,)
    await pool.set_seed(SEED)
    td = await pool.reset()
    assert td.batch_size == torch.Size([N, SUB])
    assert td["done"].shape == (N, SUB, 1)
    assert td["env_index"].tolist() == [[0] * SUB, [1] * SUB]
    assert torch.equal(td["observation"], first)
    partial = 0
    for t in range(STEPS):
        td["action"] = actions[t]
        out, td = await pool.step_and_maybe_reset(td)
        assert out.batch_size == td.batch_size == torch.Size([N, SUB])
        got = _record(out, td)
        for key, value in expected[t].items():
            assert got[key].shape == value.shape, (t, key)
            assert torch.equal(got[key], value.to(got[key].dtype)), f"step {t}: {key}\n{got[key]}\n{value}"
        done = out["next", "done"].squeeze(-1)
        kept = ~done & done.any(-1, keepdim=True)  # sub-envs going on beside one that ended
        if bool(kept.any()):
            partial += 1
            # their episode goes on: the counter (observation[..., 0]) is not back to 0
            assert bool((td["observation"][..., 0][kept] > 0).all())
    assert partial >= 3


async def test_a_partial_reset_by_mask_resets_only_the_sub_envs_marked(make_pool) -> None:
    envs = import_torchrl("torchrl.envs")
    mask = torch.tensor([[True, False, False], [False, True, True]]).unsqueeze(-1)
    action = torch.ones(N, SUB, dtype=torch.long)
    serial = envs.SerialEnv(N, _countdown)
    try:
        serial.set_seed(SEED)
        td = serial.reset()
        td["action"] = action
        td = serial.step(td)
        td = envs.utils.step_mdp(td)
        td["_reset"] = mask
        expected = serial.reset(td)["observation"]
    finally:
        serial.close()
    pool = await make_pool([_countdown] * N)
    await pool.set_seed(SEED)
    td = await pool.reset()
    td["action"] = action
    td = envs.utils.step_mdp(await pool.step(td))
    td["_reset"] = mask
    out = await pool.reset(td)
    assert torch.equal(out["observation"], expected)
    assert out["observation"][..., 0].tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert "_reset" not in out.keys()


async def test_actions_without_the_sub_env_dim_are_refused_naming_the_key(make_pool) -> None:
    pool = await make_pool([_countdown] * N)
    await pool.reset()
    td = TensorDict({"action": torch.zeros(N, dtype=torch.long)}, [N])
    with pytest.raises(
        ValueError, match=r"env 0 \(and 1 more\): 'action' has shape \(\) per env, expected \(3,\)"
    ):
        await pool.step(td)
    assert pool.stats().steps == [0, 0]  # refused before anything was dispatched


async def test_members_whose_batch_sizes_differ_are_refused_naming_them(make_pool) -> None:
    with pytest.raises(EnvError, match=r"env 1 has batch size \[3\] but env 0 has batch size \[\]") as info:
        await make_pool([_cartpole, _countdown])
    assert info.value.env_index == 1


def test_the_sync_shim_steps_resets_and_rolls_out_batched_members(executor: str) -> None:
    actions = _actions()
    first, expected = _torchrl_run(actions)
    with SerialEnv(N, _countdown, executor=executor) as env:
        assert env.batch_size == torch.Size([N, SUB])
        env.set_seed(SEED)
        td = env.reset()
        assert torch.equal(td["observation"], first)
        for t in range(4):
            td["action"] = actions[t]
            out, td = env.step_and_maybe_reset(td)
            assert torch.equal(out["next", "reward"], expected[t]["reward"])
            assert torch.equal(td["observation"], expected[t]["reset_observation"])
        traj = env.rollout(9, break_when_any_done=False)
        assert traj.batch_size == torch.Size([N, SUB, 9])
        assert traj["next", "done"].shape == (N, SUB, 9, 1)
        assert bool(traj["next", "done"].any())
        first_done = env.rollout(9)  # stops at the first step where a sub-env is done
        assert bool(first_done["next", "done"][..., -1, :].any())
        assert not bool(first_done["next", "done"][..., :-1, :].any())


def test_the_torchrl_wrapper_rolls_out_batched_members_as_torchrl_serial_env(executor: str) -> None:
    envs = import_torchrl("torchrl.envs")
    from aenvs.torchrl import AenvsWrapper

    def policy(td: TensorDictBase) -> TensorDictBase:
        return td.set("action", torch.full((N, SUB), 2, dtype=torch.long))

    serial = envs.SerialEnv(N, _countdown)
    try:
        serial.set_seed(SEED)
        expected = serial.rollout(9, policy, break_when_any_done=False)
    finally:
        serial.close()
    env = AenvsWrapper(SerialEnv(N, _countdown, executor=executor))
    try:
        assert env.batch_size == torch.Size([N, SUB])
        env.set_seed(SEED)
        got = env.rollout(9, policy, break_when_any_done=False)
    finally:
        env.close()
    assert got.batch_size == expected.batch_size == torch.Size([N, SUB, 9])
    for key in ("observation", ("next", "observation"), ("next", "reward"), ("next", "done")):
        assert torch.equal(got[key], expected[key].to(got[key].dtype)), key

"""Non-tensor actions (text, token lists, messages) reach the envs on every executor, come
back in the batch, and bad ones are refused before dispatch naming the env and the key."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from aenvs import SerialEnv, check_env_specs, step_mdp
from aenvs._tensors import non_tensor_stack
from tests.behaviour.language_envs import WORDS, EchoTextEnv, ToolEnv
from tests.conftest import PoolFactory


def text_actions(values: list[str]) -> TensorDict:
    td = TensorDict({}, [len(values)])
    td["action"] = values
    return td


async def test_text_actions_reach_the_envs_and_text_comes_back(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 3)
    reset = await pool.reset()
    assert reset["observation"] == ["start"] * 3
    out = await pool.step(text_actions(["a", "bb", "ccc"]))
    assert out["next", "observation"] == ["1:a", "1:bb", "1:ccc"]
    assert out["next", "reward"].flatten().tolist() == [1.0, 2.0, 3.0]
    assert out["action"] == ["a", "bb", "ccc"]  # the batch keeps what each env was sent
    # a partial step: the values go to the envs named, in the order named
    await pool.async_step_send(text_actions(["x", "yy"]), env_index=[2, 0])
    part = await pool.async_step_recv(min_get=2)
    got = dict(zip(part["env_index"].tolist(), part["next", "observation"], strict=True))
    assert got == {2: "2:x", 0: "2:yy"}


async def test_a_batch_received_in_parts_keeps_the_text_it_was_sent_with(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 3)
    await pool.reset()
    td = step_mdp(await pool.step(text_actions(["a", "bb", "ccc"])))  # text observations at the root
    td["action"] = ["x", "y", "z"]
    await pool.async_step_send(td)
    parts = [await pool.async_step_recv(min_get=1, max_get=1), await pool.async_step_recv(min_get=2)]
    seen: list[int] = []
    for part in parts:
        envs = part["env_index"].tolist()
        seen += envs
        assert part["observation"] == [["1:a", "1:bb", "1:ccc"][i] for i in envs]
        assert part["action"] == [["x", "y", "z"][i] for i in envs]
        assert part["next", "observation"] == [f"2:{'xyz'[i]}" for i in envs]
    assert sorted(seen) == [0, 1, 2]


async def test_one_text_for_every_env_and_episodes_ended_by_text(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 2)
    await pool.reset()
    td = TensorDict({}, [2])
    td.set_non_tensor("action", "quit")  # one value for all
    out, following = await pool.step_and_maybe_reset(td)
    assert out["next", "observation"] == ["1:quit", "1:quit"]
    assert out["next", "done"].flatten().tolist() == [True, True]
    assert following["observation"] == ["start", "start"]  # reset after the episode ended


async def test_token_lists_and_messages_reach_a_native_env(make_pool: PoolFactory) -> None:
    pool = await make_pool([ToolEnv] * 3)
    await pool.reset()
    td = TensorDict({}, [3])
    td["action", "tokens"] = non_tensor_stack([(1, 2, 3), (), (999,) * 40])
    td["action", "message"] = non_tensor_stack([{"role": "user", "content": f"m{i}"} for i in range(3)])
    out = await pool.step(td)
    assert out["next", "observation"] == ["6|m0", "0|m1", "39960|m2"]
    assert out["next", "reward"].flatten().tolist() == [3.0, 0.0, 40.0]


@pytest.mark.parametrize(
    ("values", "error", "words"),
    [
        (["ok", 3, "ok"], TypeError, ["env 1", "'action'", "must be a str"]),
        (["ok", "ok", "x" * 17], ValueError, ["env 2", "'action'", "length 17"]),
        (["ok", "no spaces", "ok"], ValueError, ["env 1", "'action'", "charset"]),
    ],
)
async def test_bad_text_is_refused_before_dispatch_and_the_pool_stays_usable(
    make_pool: PoolFactory, values: list[object], error: type[Exception], words: list[str]
) -> None:
    pool = await make_pool([EchoTextEnv] * 3)
    await pool.reset()
    td = TensorDict({}, [3])
    td["action"] = non_tensor_stack(values)
    with pytest.raises(error) as caught:
        await pool.step(td)
    for word in words:
        assert word in str(caught.value)
    out = await pool.step(text_actions(["a", "b", "c"]))
    assert out["next", "observation"] == ["1:a", "1:b", "1:c"]  # the refused step never ran


async def test_a_missing_text_action_names_the_env_and_the_key(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 2)
    await pool.reset()
    with pytest.raises(ValueError, match=r"env 0: the input has no 'action' entry"):
        await pool.step(TensorDict({}, [2]))
    out = await pool.step(text_actions(["a", "b"]))
    assert out["next", "observation"] == ["1:a", "1:b"]


async def test_random_text_actions_and_rollouts(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 2)
    actions = pool.rand_action(generator=torch.Generator().manual_seed(0))
    assert all(WORDS.contains(a) for a in actions["action"])
    again = pool.rand_action(generator=torch.Generator().manual_seed(0))
    assert actions["action"] == again["action"]  # seeded: the same draws
    traj = await pool.rollout(3)
    assert traj.batch_size == (2, 3)
    for i in range(2):
        sent = traj[i]["action"]
        assert traj[i]["next", "observation"] == [f"{t + 1}:{a}" for t, a in enumerate(sent)]


def test_the_sync_shim_rolls_out_text_envs(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    env = SerialEnv(2, EchoTextEnv, executor=executor, loop_factory=loop_factory)
    try:
        check_env_specs(env)
        traj = env.rollout(3, lambda td: td.set("action", non_tensor_stack(["go", "look"])))
        assert traj.batch_size == (2, 3)
        assert traj[1]["next", "observation"] == ["1:look", "2:look", "3:look"]
    finally:
        env.close()

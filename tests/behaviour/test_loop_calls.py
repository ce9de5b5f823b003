"""The pool's calls for loops that drive it: wait_ready, abandon, and sending and receiving
as columns, on every executor and loop; bad input refused before dispatch naming env and key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from tests.behaviour.language_envs import EchoTextEnv
from tests.conftest import PoolFactory
from tests.helpers import Gate, gated_env_fns, until


async def test_text_actions_as_columns_come_back_as_columns(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 3)
    await pool.reset()
    await pool.async_step_send_columns([2, 0], {"action": ["go", "quit"]})
    seen: dict[int, str] = {}
    while len(seen) < 2:
        await pool.wait_ready(timeout=30)
        columns = await pool.async_step_recv_columns()
        rows = columns[("env_index",)].tolist()
        for row, i in enumerate(rows):
            seen[i] = columns[("observation",)][row]
            assert columns[("reward",)][row, 0] == len(seen[i].split(":")[1])
            assert bool(columns[("terminated",)][row, 0]) == (i == 0)
    assert seen == {2: "1:go", 0: "1:quit"}
    assert (await pool.async_step_recv_columns())[("env_index",)].size == 0  # nothing left: empty


async def test_tensor_actions_as_columns(make_pool: PoolFactory) -> None:
    pool = await make_pool(["CartPole-v1"] * 2)
    await pool.reset()
    await pool.async_step_send_columns([0, 1], {("action",): torch.tensor([0, 1])})
    got: list[int] = []
    while len(got) < 2:
        await pool.wait_ready(timeout=30)
        columns = await pool.async_step_recv_columns(max_get=1)
        assert columns[("observation",)].shape[1:] == (4,)
        got += columns[("env_index",)].tolist()
    assert sorted(got) == [0, 1]


async def test_columns_received_as_named_wait_for_those_envs_in_that_order(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 3)
    await pool.reset()
    await pool.async_step_send_columns([0, 1, 2], {"action": ["a", "bb", "ccc"]})
    columns = await pool.async_step_recv_columns(min_get=None, env_index=[2, 0], timeout=30)
    assert columns[("env_index",)].tolist() == [2, 0]
    assert columns[("observation",)] == ["1:ccc", "1:a"]
    assert columns[("reward",)][:, 0].tolist() == [3.0, 1.0]
    rest = await pool.async_step_recv_columns(min_get=1, timeout=30)  # env 1's, and nothing twice
    assert rest[("env_index",)].tolist() == [1]
    assert rest[("observation",)] == ["1:bb"]


async def test_a_columns_receive_that_times_out_leaves_the_results_ready(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(2, gate))
    await pool.reset()
    await pool.async_step_send_columns([0], {"action": torch.tensor([[4.0]], dtype=torch.float64)})
    with pytest.raises(ValueError, match="env 1 has no step"):  # nothing sent to env 1: refused, not awaited
        await pool.async_step_recv_columns(min_get=None, env_index=[0, 1])
    with pytest.raises(TimeoutError):
        await pool.async_step_recv_columns(min_get=None, env_index=[0], timeout=0.05)
    gate.open()
    columns = await pool.async_step_recv_columns(min_get=None, env_index=[0], timeout=30)
    assert columns[("env_index",)].tolist() == [0]
    assert columns[("observation",)][:, 1].tolist() == [4.0]


async def test_bad_column_actions_are_refused_before_dispatch(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 2)
    await pool.reset()
    with pytest.raises(ValueError, match=r"env 1.*'action'"):
        await pool.async_step_send_columns([0, 1], {"action": ["go", None]})
    with pytest.raises(TypeError, match=r"env 0.*'action'"):
        await pool.async_step_send_columns([0], {"action": [3]})
    with pytest.raises(ValueError, match="action"):
        await pool.async_step_send_columns([0, 1], {"other": ["go", "go"]})
    assert (await pool.step(pool.rand_action())).batch_size == torch.Size([2])  # usable after


async def test_abandon_frees_the_envs_for_the_next_whole_batch_call(make_pool: PoolFactory) -> None:
    pool = await make_pool(["CartPole-v1"] * 3)
    await pool.reset()
    await pool.async_step_send_columns([0, 1, 2], {"action": torch.tensor([0, 1, 0])})
    pool.abandon([0, 2])
    out = await pool.async_step_recv(env_index=[1])  # env 1's result is still there
    assert out["env_index"].tolist() == [1]
    assert pool.has_abandoned or (await pool.reset()).batch_size == torch.Size([3])
    assert (await pool.reset()).batch_size == torch.Size([3])
    with pytest.raises(ValueError, match="wait forever"):
        await pool.wait_ready()


async def test_step_and_maybe_reset_as_columns_gives_what_the_tensordict_call_gives(
    make_pool: PoolFactory,
) -> None:
    by_columns = await make_pool(["CartPole-v1"] * 3)
    by_tensordicts = await make_pool(["CartPole-v1"] * 3)
    await by_columns.reset(seed=7)
    td = await by_tensordicts.reset(seed=7)
    ended = 0
    for t in range(40):
        action = torch.tensor([t % 2, 0, 1])  # envs 1 and 2 fall within a few steps, then start again
        step, following = await by_columns.step_and_maybe_reset_columns({"action": action})
        out, td = await by_tensordicts.step_and_maybe_reset(td.set("action", action))
        assert step[("env_index",)].tolist() == following[("env_index",)].tolist() == [0, 1, 2]
        for key in ("observation", "reward", "done", "terminated", "truncated"):
            assert torch.equal(torch.from_numpy(step[(key,)]), out["next", key]), (t, key)
        for key in ("observation", "done", "terminated", "truncated"):
            assert torch.equal(torch.from_numpy(following[(key,)]), td[key]), (t, key)
        ended += int(step[("done",)].sum())
    assert ended >= 2  # resets taken inside the calls, as the TensorDict call takes them


async def test_step_and_maybe_reset_columns_carry_text_as_lists(make_pool: PoolFactory) -> None:
    pool = await make_pool([EchoTextEnv] * 2)
    await pool.reset()
    step, following = await pool.step_and_maybe_reset_columns({"action": ["go", "quit"]})
    assert step[("observation",)] == ["1:go", "1:quit"]
    assert step[("terminated",)][:, 0].tolist() == [False, True]
    assert following[("observation",)][0] == "1:go"  # env 1 ended: its reset observation instead
    assert following[("observation",)][1] != "1:quit"


async def test_bad_columns_for_a_whole_batch_step_are_refused_before_dispatch(make_pool: PoolFactory) -> None:
    pool = await make_pool(["CartPole-v1"] * 3)
    await pool.reset(seed=0)
    with pytest.raises(ValueError, match=r"'action' have 2 rows for 3 envs"):
        await pool.step_and_maybe_reset_columns({"action": torch.tensor([0, 1])})
    with pytest.raises(ValueError, match=r"env 0.*'action'.*dtype torch.float32"):
        await pool.step_and_maybe_reset_columns({"action": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"'action'"):
        await pool.step_and_maybe_reset_columns({"other": torch.zeros(3, dtype=torch.long)})
    assert pool.stats().in_flight == 0 and sum(pool.stats().steps) == 0  # nothing was dispatched
    step, _ = await pool.step_and_maybe_reset_columns({"action": torch.tensor([0, 1, 0])})
    assert step[("env_index",)].tolist() == [0, 1, 2]


async def test_a_lazy_pool_refuses_whole_batch_columns(make_pool: PoolFactory) -> None:
    pool = await make_pool(["CartPole-v1", "Pendulum-v1"])
    await pool.reset(seed=0)
    with pytest.raises(ValueError, match="dense pool"):
        await pool.step_and_maybe_reset_columns({"action": torch.zeros(2, dtype=torch.long)})
    assert pool.stats().in_flight == 0


async def test_a_cancelled_whole_batch_columns_call_loses_nothing(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(3, gate))
    await pool.reset()
    action = {"action": torch.ones(3, 1, dtype=torch.float64)}
    call = asyncio.create_task(pool.step_and_maybe_reset_columns(action))
    await until(lambda: pool.stats().in_flight == 3)  # every env is in its (gated) step
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert pool.has_abandoned
    gate.open()
    step, following = await pool.step_and_maybe_reset_columns(
        {"action": torch.full((3, 1), 2.0, dtype=torch.float64)}
    )
    assert step[("observation",)][:, 2].tolist() == [2.0] * 3  # stepped twice each: none lost or repeated
    assert following[("observation",)][:, 1].tolist() == [2.0] * 3
    stats = pool.stats()
    assert stats.in_flight == 0 and stats.ready == 0 and not pool.has_abandoned

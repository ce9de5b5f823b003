"""Split-phase stepping: send / recv, min_get, max_get, env_index, timeout, cancellation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aenvs import EnvBusyError
from aenvs.testing import echo_env_fns
from tests.helpers import Gate, actions, gated_env_fns


async def _until_waiting(task: asyncio.Task) -> None:
    """Let ``task`` run until it blocks (it awaits nothing else first)."""
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()


async def test_send_returns_before_the_step_finishes(make_pool, tmp_path) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(3, gate))
    await pool.reset()
    await pool.async_step_send(actions([1, 2, 3]))
    stats = pool.stats()
    assert stats.in_flight == 3 and stats.ready == 0
    gate.open()
    out = await pool.async_step_recv(min_get=3)
    assert out["next", "observation"][:, 1].tolist() == [1.0, 2.0, 3.0]


async def test_recv_layout_is_torchrl(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    td = await pool.reset()
    td["action"] = torch.tensor([[4.0], [5.0]], dtype=torch.float64)
    td["logits"] = torch.randn(2, 3)
    await pool.async_step_send(td)
    out = await pool.async_step_recv(min_get=2)
    assert out.batch_size == torch.Size([2])
    assert torch.equal(out["logits"], td["logits"])  # inputs at the root
    assert torch.equal(out["observation"], td["observation"])
    assert out["next", "observation"][:, 1].tolist() == [4.0, 5.0]
    assert out["next", "reward"].dtype == torch.float32 and out["next", "reward"].shape == (2, 1)
    for key in ("done", "terminated", "truncated"):
        assert out["next", key].dtype == torch.bool and out["next", key].shape == (2, 1)
    assert out["env_index"].tolist() == [0, 1]
    assert "reward" not in td.keys()  # the caller's td is not modified


async def test_min_get_max_get_and_env_index_partition_results(make_pool) -> None:
    pool = await make_pool(echo_env_fns(4))
    await pool.reset()
    await pool.async_step_send(actions([10, 11, 12, 13]))
    first = await pool.async_step_recv(env_index=[3, 1])
    assert first["env_index"].tolist() == [3, 1]
    assert first["next", "observation"][:, 1].tolist() == [13.0, 11.0]
    second = await pool.async_step_recv(min_get=1, max_get=1)
    assert second.batch_size == torch.Size([1])
    third = await pool.async_step_recv(min_get=1)
    got = first["env_index"].tolist() + second["env_index"].tolist() + third["env_index"].tolist()
    assert sorted(got) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="would wait forever"):
        await pool.async_step_recv()


async def test_recv_gathers_each_envs_own_sent_entries_across_sends(make_pool) -> None:
    """Envs sent in three batches, received in one: each row carries what its own send held,
    in every dtype, including tensors numpy cannot view (bfloat16, requiring grad)."""
    pool = await make_pool(echo_env_fns(4))
    await pool.reset()
    logits = torch.arange(8.0).reshape(4, 2)
    for rows in ([2, 0], [3], [1]):
        td = actions([10.0 + i for i in rows], env_index=rows)
        if rows == [3]:
            td["action"].requires_grad_()  # written into the action rows by torch, not numpy
        td["logits"] = logits[rows].requires_grad_()
        td["half"] = logits[rows].to(torch.bfloat16)
        td["count"] = torch.tensor(rows, dtype=torch.int32)
        await pool.async_step_send(td)
    out = await pool.async_step_recv(min_get=4)
    assert out["env_index"].tolist() == [0, 1, 2, 3]
    assert out["action"][:, 0].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert out["next", "observation"][:, 1].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert out["count"].dtype == torch.int32 and out["count"].tolist() == [0, 1, 2, 3]
    assert torch.equal(out["logits"].detach(), logits)
    assert out["half"].dtype == torch.bfloat16 and torch.equal(out["half"], logits.to(torch.bfloat16))


async def test_recv_across_sends_of_plain_actions_returns_each_envs_action(make_pool) -> None:
    """The overlapped loop's case: every send holds plain actions and its "env_index" (what
    the batcher copies from the pool's action rows); a receive spanning sends returns each
    env's own action and its own index, and again after the envs are sent in new groups."""
    pool = await make_pool(echo_env_fns(5))
    await pool.reset()
    for round_ in range(2):
        groups = ([4, 1], [0, 3, 2]) if round_ == 0 else ([2], [0, 4], [3, 1])
        for rows in groups:
            await pool.async_step_send(actions([100.0 * round_ + i for i in rows], env_index=rows))
        some = await pool.async_step_recv(env_index=[3, 0, 4])  # rows of two sends, out of order
        rest = await pool.async_step_recv(min_get=2)
        for out, rows in ((some, [3, 0, 4]), (rest, [1, 2])):
            assert out["env_index"].tolist() == rows
            assert out["action"][:, 0].tolist() == [100.0 * round_ + i for i in rows]
            assert out["next", "observation"][:, 1].tolist() == out["action"][:, 0].tolist()


async def test_recv_across_sends_keeps_a_policys_graph(make_pool) -> None:
    """Actions that require grad in every send come back as sent, their graph intact."""
    pool = await make_pool(echo_env_fns(3))
    await pool.reset()
    scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    for rows in ([2], [0, 1]):
        td = actions([float(i) for i in rows], env_index=rows)
        td["action"] = td["action"] * scale  # a policy's output
        await pool.async_step_send(td)
    out = await pool.async_step_recv(min_get=3)
    assert out["action"].requires_grad
    assert out["action"][:, 0].tolist() == [0.0, 2.0, 4.0]
    out["action"].sum().backward()
    assert scale.grad is not None and scale.grad.item() == 3.0  # 0 + 1 + 2


async def test_recv_returns_every_ready_result_up_to_max_get(make_pool) -> None:
    pool = await make_pool(echo_env_fns(5))
    await pool.reset()
    await pool.async_step_send(actions([1] * 5))
    out = await pool.async_step_recv(min_get=5, max_get=10)
    assert out["env_index"].tolist() == [0, 1, 2, 3, 4]


async def test_recv_argument_errors(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    await pool.async_step_send(actions([1], env_index=[0]))
    with pytest.raises(ValueError, match="min_get=2"):
        await pool.async_step_recv(min_get=2)
    with pytest.raises(ValueError, match="max_get"):
        await pool.async_step_recv(min_get=1, max_get=0)
    with pytest.raises(ValueError, match="env 1 has no step"):
        await pool.async_step_recv(env_index=1)
    with pytest.raises(IndexError, match="env index 7"):
        await pool.async_step_recv(env_index=7)
    out = await pool.async_step_recv(env_index=0)  # still there after the bad calls
    assert out["env_index"].tolist() == [0]


async def test_min_get_zero_polls_without_waiting(make_pool, tmp_path) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(2, gate))
    await pool.reset()
    await pool.async_step_send(actions([1, 1]))
    empty = await pool.async_step_recv(min_get=0)
    assert empty.batch_size == torch.Size([0])
    gate.open()
    assert (await pool.async_step_recv(min_get=2)).batch_size == torch.Size([2])


async def test_timeout_raises_and_loses_nothing(make_pool, tmp_path) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(3, gate))
    await pool.reset()
    await pool.async_step_send(actions([1, 2, 3]))
    with pytest.raises(TimeoutError):
        await pool.async_step_recv(min_get=3, timeout=0.05)
    gate.open()
    out = await pool.async_step_recv(min_get=3)
    assert out["next", "observation"][:, 1].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("how", ["task.cancel", "asyncio.timeout"])
async def test_cancelled_recv_loses_nothing(make_pool, tmp_path, how: str) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(2, gate))
    await pool.reset()
    await pool.async_step_send(actions([7, 8]))
    if how == "task.cancel":
        task = asyncio.create_task(pool.async_step_recv(min_get=2))
        await _until_waiting(task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pool.async_step_recv(min_get=2)
    gate.open()
    out = await pool.async_step_recv(min_get=2)
    assert out["next", "observation"][:, 1].tolist() == [7.0, 8.0]


async def test_second_send_to_a_busy_env_raises_and_keeps_the_first(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    await pool.async_step_send(actions([1], env_index=[0]))
    with pytest.raises(EnvBusyError) as info:
        await pool.async_step_send(actions([2, 2]))
    assert info.value.env_index == 0
    assert "env 0" in str(info.value)
    out = await pool.async_step_recv(env_index=0)
    assert out["next", "observation"][0, 1] == 1.0
    with pytest.raises(ValueError, match="would wait forever"):  # env 1 was never dispatched
        await pool.async_step_recv()
    await pool.async_step_send(actions([3, 3]))
    assert (await pool.async_step_recv(min_get=2))["next", "observation"][:, 1].tolist() == [3.0, 3.0]


async def test_many_rounds_deliver_each_result_exactly_once(make_pool) -> None:
    n = 6
    pool = await make_pool(echo_env_fns(n, delay=(0.0, 0.002)))
    await pool.reset()
    sent = dict.fromkeys(range(n), 0)
    received: list[tuple[int, float, float]] = []
    await pool.async_step_send(actions([1.0] * n))
    for i in range(n):
        sent[i] = 1
    while len(received) < 20 * n:
        out = await pool.async_step_recv(min_get=1)
        obs = out["next", "observation"]
        received += [(int(e), float(a), float(s)) for e, a, s in obs.tolist()]
        idx = out["env_index"].tolist()
        for i in idx:
            sent[i] += 1
        if sum(sent.values()) <= 20 * n:
            await pool.async_step_send(actions([float(sent[i]) for i in idx], env_index=idx))
        else:
            break
    # env i's k-th result echoes action k and step count k
    for env in range(n):
        mine = [(a, s) for e, a, s in received if e == env]
        assert mine == [(float(k), float(k)) for k in range(1, len(mine) + 1)]


async def test_reset_subset_and_split_phase_reset(make_pool) -> None:
    pool = await make_pool(echo_env_fns(4))
    await pool.reset()
    await pool.step(actions([1, 1, 1, 1]))
    out = await pool.reset(env_index=[3, 1])
    assert out["env_index"].tolist() == [3, 1]
    assert out["observation"][:, 2].tolist() == [0.0, 0.0]
    await pool.async_reset_send(env_index=[0, 2])
    got = await pool.async_reset_recv(min_get=2)
    assert got["env_index"].tolist() == [0, 2]
    assert got["done"].shape == (2, 1) and not got["done"].any()
    with pytest.raises(ValueError):
        await pool.async_reset_recv()


async def test_step_and_reset_results_do_not_mix(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    await pool.async_step_send(actions([5], env_index=[0]))
    await pool.async_reset_send(env_index=[1])
    reset = await pool.async_reset_recv()
    step = await pool.async_step_recv()
    assert reset["env_index"].tolist() == [1]
    assert step["env_index"].tolist() == [0]


async def test_step_and_maybe_reset_resets_done_envs(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2, episode_length=2))
    td = await pool.reset()
    td["action"] = torch.ones(2, 1, dtype=torch.float64)
    out, nxt = await pool.step_and_maybe_reset(td)
    assert not out["next", "done"].any()
    assert torch.equal(nxt["observation"], out["next", "observation"])
    nxt["action"] = torch.ones(2, 1, dtype=torch.float64)
    out, nxt = await pool.step_and_maybe_reset(nxt)
    assert out["next", "done"].all()
    assert out["next", "observation"][:, 2].tolist() == [2.0, 2.0]  # the final observation
    assert nxt["observation"][:, 2].tolist() == [0.0, 0.0]  # already reset
    assert not nxt["done"].any()
    assert "reward" not in nxt.keys()


async def test_split_phase_step_and_maybe_reset(make_pool) -> None:
    pool = await make_pool(echo_env_fns(3, episode_length=1))
    td = await pool.reset()
    td["action"] = torch.ones(3, 1, dtype=torch.float64)
    await pool.async_step_and_maybe_reset_send(td)
    out, nxt = await pool.async_step_and_maybe_reset_recv(min_get=3)
    assert out["next", "done"].all()
    assert nxt["env_index"].tolist() == [0, 1, 2]
    assert nxt["observation"][:, 2].tolist() == [0.0, 0.0, 0.0]

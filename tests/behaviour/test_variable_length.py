"""Entries whose shape differs between envs or between steps (token ids, point clouds, grids)
arrive exactly, stacked lazily at their own key; the batch's other entries stay dense."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorStack, TensorDict, TensorDictBase

from aenvs import SerialEnv
from aenvs._layout import step_mdp
from aenvs._ragged import as_jagged
from tests.behaviour.ragged_envs import SequenceEnv, TokenEnv, cloud, grid, token_count, tokens

N = 3


def token_fns(n: int = N, **kwargs: Any) -> list[Any]:
    return [functools.partial(TokenEnv, i, **kwargs) for i in range(n)]


def sequence_fns(n: int = N) -> list[Any]:
    return [functools.partial(SequenceEnv, i) for i in range(n)]


def row(td: TensorDictBase, i: int, key: Any) -> torch.Tensor:
    value = td[i][key]
    assert isinstance(value, torch.Tensor), f"row {i} of {key}: {type(value).__name__}"
    return value


def assert_rows(td: TensorDictBase, key: Any, expected: list[torch.Tensor]) -> None:
    """Each row of ``td[key]`` is exactly what that env returned (values, shape and dtype)."""
    assert td.batch_size[0] == len(expected)
    for i, want in enumerate(expected):
        got = row(td, i, key)
        assert got.dtype == want.dtype and got.shape == want.shape, (key, i, got.shape, want.shape)
        assert torch.equal(got, want), (key, i)


def assert_dense(td: TensorDictBase, key: Any, shape: tuple[int, ...]) -> None:
    value = td.get(key)
    assert type(value) is torch.Tensor and tuple(value.shape) == shape, (key, type(value))


def ones(n: int = N) -> torch.Tensor:
    return torch.ones(n, dtype=torch.int64)


async def test_native_env_rows_arrive_exactly_and_the_rest_stays_dense(make_pool) -> None:
    pool = await make_pool(token_fns())
    assert pool.is_dense
    td = await pool.reset()
    assert type(td) is TensorDict
    assert_dense(td, "tokens", (N, token_count(0, 0)))  # step 0: the envs agree, a dense stack
    assert isinstance(td.get("cloud"), NonTensorStack)  # they differ: a lazy stack at its key
    assert_rows(td, "cloud", [cloud(i, 0) for i in range(N)])
    for step in range(1, 5):
        td["action"] = ones()
        out = await pool.step(td)
        assert type(out) is TensorDict
        assert_dense(out, ("next", "observation"), (N, 2))
        assert_dense(out, ("next", "reward"), (N, 1))
        assert_rows(out, ("next", "tokens"), [tokens(i, step) for i in range(N)])
        assert_rows(out, ("next", "cloud"), [cloud(i, step) for i in range(N)])
        assert_rows(out, "tokens", [tokens(i, step - 1) for i in range(N)])  # the sent entries kept
        kind = torch.Tensor if step % 2 == 0 else NonTensorStack  # agree on even steps only
        assert isinstance(out.get(("next", "tokens")), kind)
        td = step_mdp(out)


async def test_a_lazy_pool_holds_each_envs_tensor(make_pool) -> None:
    pool = await make_pool(token_fns(), stack="lazy")
    td = await pool.reset()
    assert isinstance(td, LazyStackedTensorDict)
    td["action"] = ones()
    out = await pool.step(td)
    assert_rows(out, ("next", "tokens"), [tokens(i, 1) for i in range(N)])
    assert_rows(out, ("next", "cloud"), [cloud(i, 1) for i in range(N)])
    assert out.get(("next", "observation")).shape == (N, 2)
    nested = out.get(("next", "tokens"), as_nested_tensor=True)
    assert [t.tolist() for t in nested.unbind()] == [tokens(i, 1).tolist() for i in range(N)]


async def test_gymnasium_sequence_observations_and_infos(make_pool) -> None:
    pool = await make_pool(sequence_fns())
    td = await pool.reset()
    assert_rows(td, "cloud", [cloud(i, 0) for i in range(N)])
    td["action"] = ones()
    out = await pool.step(td)
    assert type(out) is TensorDict
    assert_dense(out, ("next", "position"), (N, 2))
    assert_rows(out, ("next", "tokens"), [tokens(i, 1) for i in range(N)])
    assert_rows(out, ("next", "cloud"), [cloud(i, 1) for i in range(N)])
    # a varying-length info entry: the info stays a dense TensorDict, the entry lazy
    assert type(out.get(("next", "info"))) is TensorDict
    assert_rows(out, ("next", "info", "ids"), [tokens(i, 1) for i in range(N)])


@pytest.mark.parametrize("fns", [token_fns, sequence_fns])
async def test_partial_steps_and_receives(make_pool, fns) -> None:
    pool = await make_pool(fns())
    td = await pool.reset()
    td["action"] = ones()
    first = step_mdp(await pool.step(td))  # every env at step 1
    sub = first[torch.tensor([0, 2])]
    sub["action"] = ones(2)
    out = await pool.step(sub, env_index=[0, 2])  # envs 0 and 2 at step 2
    assert out["env_index"].tolist() == [0, 2]
    assert_rows(out, ("next", "tokens"), [tokens(0, 2), tokens(2, 2)])
    assert_rows(out, ("next", "cloud"), [cloud(0, 2), cloud(2, 2)])
    out = await pool.step(first[torch.tensor([1])].set("action", ones(1)), env_index=[1])  # env 1 to step 2
    assert_rows(out, ("next", "tokens"), [tokens(1, 2)])
    # every env sent, received in two parts: each part's rows are its envs'
    first["action"] = ones()
    await pool.async_step_send(first)
    got = [await pool.async_step_recv(min_get=1, max_get=1), await pool.async_step_recv(min_get=2)]
    seen = 0
    for part in got:
        envs = part["env_index"].tolist()
        seen += len(envs)
        assert_rows(part, ("next", "tokens"), [tokens(i, 3) for i in envs])
        assert_rows(part, "tokens", [tokens(i, 1) for i in envs])  # the sent rows, kept
        assert_rows(part, ("next", "cloud"), [cloud(i, 3) for i in envs])
        assert_dense(part, ("next", "reward"), (len(envs), 1))
    assert seen == N


async def test_step_and_maybe_reset_carries_both_halves(make_pool) -> None:
    pool = await make_pool(token_fns(episode=2))
    td = await pool.reset()
    for step in (1, 2):
        td["action"] = ones()
        out, td = await pool.step_and_maybe_reset(td)
        assert_rows(out, ("next", "tokens"), [tokens(i, step) for i in range(N)])
        assert_rows(out, ("next", "cloud"), [cloud(i, step) for i in range(N)])
        assert type(td) is TensorDict
    # step 2 ended every episode: the next input holds the reset observations
    assert_rows(td, "tokens", [tokens(i, 0) for i in range(N)])
    assert_rows(td, "cloud", [cloud(i, 0) for i in range(N)])


async def test_two_varying_dims_fall_back_to_the_lazy_stack(make_pool) -> None:
    pool = await make_pool(token_fns(with_grid=True))
    td = await pool.reset()
    td["action"] = ones()
    out = await pool.step(td)
    assert type(out) is TensorDict
    assert isinstance(out.get(("next", "grid")), NonTensorStack)
    assert_rows(out, ("next", "grid"), [grid(i, 1) for i in range(N)])
    assert as_jagged([grid(i, 1) for i in range(N)]) is None  # no jagged tensor holds them
    nested = as_jagged([row(out, i, ("next", "cloud")) for i in range(N)])  # but point clouds fit one
    assert nested is not None and torch.equal(nested.values(), torch.cat([cloud(i, 1) for i in range(N)]))


def test_the_sync_shims_rollout_keeps_every_step(executor: str) -> None:
    with SerialEnv(N, token_fns(), executor=executor) as env:
        traj = env.rollout(4, policy=lambda td: td.set("action", ones()), break_when_any_done=False)
    assert traj.batch_size == (N, 4)
    assert traj.get(("next", "observation")).shape == (N, 4, 2)
    for i in range(N):
        for t in range(4):
            step = traj[i, t]
            assert torch.equal(step["next", "tokens"], tokens(i, t + 1))
            assert torch.equal(step["next", "cloud"], cloud(i, t + 1))
            assert torch.equal(step["tokens"], tokens(i, t))


async def test_a_step_mask_keeps_the_unstepped_envs_rows(make_pool) -> None:
    """``"_step"``: the envs not stepped give their input rows back, whatever their lengths,
    when the input's rows differ in length and the stepped envs' agree, and the reverse."""
    pool = await make_pool(token_fns())
    td = await pool.reset()  # step 0: the envs agree on "tokens"
    td["action"] = ones()
    td = step_mdp(await pool.step(td))  # step 1: they differ
    for stepped, t in (([True, False, True], 2), ([False, True, False], 2)):
        td["action"] = ones()
        td["_step"] = torch.tensor(stepped)
        before = [row(td, i, "tokens").clone() for i in range(N)]
        out = await pool.step(td)
        expected = [tokens(i, t) if on else before[i] for i, on in enumerate(stepped)]
        assert_rows(out, ("next", "tokens"), expected)
        td = step_mdp(out)

"""Every gymnasium space in the pool: envs with Text, Sequence, Graph, OneOf and custom
observations and actions (alone and in Dict / Tuple beside fixed parts) step on every
executor; their observations come back as non-tensor entries in TorchRL's layout, their
actions go in as lists, non-tensor stacks or one value for all; bad ones are refused
before dispatch naming the env and the key."""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs import SerialEnv, check_env_specs
from aenvs._check import EnvSpecError
from aenvs._specs import Key, observation_root, space_leaves
from aenvs._tensors import non_tensor_stack, td_get
from tests.conftest import PoolFactory
from tests.vector.space_envs import ALL_SPACES, MIXED_SPACES, OBJECT_SPACES, ObjectSpaceEnv, OutOfSpaceTextEnv

N = 3


def envs(space: str) -> list[Callable[[], ObjectSpaceEnv]]:
    return [functools.partial(ObjectSpaceEnv, space, space)] * N


def plain(value: Any) -> Any:
    """A value out of the batch as its space samples it (numeric rows come back as tensors)."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, TensorDictBase):
        return {k: plain(v) for k, v in value.to_dict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def rows(td: TensorDictBase, key: Key) -> list[Any]:
    """The values of entry ``key``, one per row of ``td``."""
    entry = td_get(td, key)
    assert entry is not None, f"no {key} entry in {td}"
    if isinstance(entry, torch.Tensor):
        return [plain(row) for row in entry.unbind(0)]
    return [plain(row) for row in (entry.tolist() if hasattr(entry, "tolist") else entry)]


def assert_observations_in_space(td: TensorDictBase, space: spaces.Space[Any]) -> None:
    """Every part of ``space`` without a fixed shape is an entry of ``td`` whose values are in
    it, and every fixed-shape part a tensor beside them."""
    root = observation_root(space)
    for leaf in space_leaves(space, root):
        value = td_get(td, leaf.key)
        assert isinstance(value, torch.Tensor), f"{leaf.key} missing from {td}"
        assert tuple(value.shape[1:]) == leaf.shape
    parts = [leaf.key for leaf in space_leaves(space, root, objects=True) if leaf.is_object]
    assert parts
    for key in parts:
        sub = space
        for part in key[len(root) :]:
            sub = sub[part] if isinstance(sub, spaces.Dict) else cast(spaces.Tuple, sub)[int(part)]
        for value in rows(td, key):
            assert sub.contains(value), f"{key}: {value!r} not in {sub}"


def actions_td(space: spaces.Space[Any], values: list[Any], as_list: bool) -> TensorDict:
    """A step input giving each env its value of ``values`` (as Python lists or non-tensor stacks)."""
    td = TensorDict({}, [len(values)])
    for key, column in columns(space, values, ("action",)).items():
        if all(isinstance(v, np.ndarray) for v in column) and len({v.shape for v in column}) == 1:
            td.set(key, torch.as_tensor(np.stack(column)))  # fixed parts: a tensor
        else:
            td.set(key, list(column) if as_list else non_tensor_stack(list(column)))
    return td


def columns(space: spaces.Space[Any], values: list[Any], path: Key) -> dict[Key, list[Any]]:
    """Per-env ``values`` of ``space`` split into the pool's action entries."""
    if isinstance(space, spaces.Dict):
        out: dict[Key, list[Any]] = {}
        for k, sub in space.spaces.items():
            out.update(columns(sub, [v[k] for v in values], (*path, k)))
        return out
    if isinstance(space, spaces.Tuple):
        out = {}
        for i, sub in enumerate(space.spaces):
            out.update(columns(sub, [v[i] for v in values], (*path, str(i))))
        return out
    if isinstance(space, spaces.Discrete):
        return {path: [np.asarray(v, dtype=np.int64) for v in values]}
    if isinstance(space, spaces.MultiBinary):
        return {path: [np.asarray(v, dtype=np.int8) for v in values]}
    return {path: list(values)}


def draw(space: str, seed: int) -> list[Any]:
    action_space = copy.deepcopy(ALL_SPACES[space])
    action_space.seed(seed)
    return [action_space.sample() for _ in range(N)]


@pytest.mark.parametrize("space", list(OBJECT_SPACES))
@pytest.mark.parametrize("as_list", [True, False], ids=["lists", "stacks"])
async def test_every_space_steps_with_its_values_as_non_tensor_entries(
    make_pool: PoolFactory, space: str, as_list: bool
) -> None:
    await check_the_pool_steps(make_pool, space, as_list)


@pytest.mark.parametrize("space", list(MIXED_SPACES))
async def test_fixed_and_other_parts_in_one_sub_dict(make_pool: PoolFactory, space: str) -> None:
    await check_the_pool_steps(make_pool, space, as_list=False)


async def check_the_pool_steps(make_pool: PoolFactory, space: str, as_list: bool) -> None:
    pool = await make_pool(envs(space))
    observation_space = ALL_SPACES[space]
    reset = await pool.reset(seed=[1, 2, 3])
    assert_observations_in_space(reset, observation_space)
    for t in range(3):
        values = draw(space, seed=t)
        out = await pool.step(actions_td(ALL_SPACES[space], values, as_list))
        assert_observations_in_space(out["next"], observation_space)
        # each env got its own value (the env checks it is in its space, and reports it)
        sent = [repr(v)[:30] for v in values]
        assert rows(out["next"], ("info", "action")) == sent
        assert out["next", "reward"].shape == (N, 1)


async def test_one_value_for_every_env(make_pool: PoolFactory) -> None:
    pool = await make_pool(envs("text"))
    await pool.reset()
    td = TensorDict({}, [N])
    td.set_non_tensor("action", "abc")
    out = await pool.step(td)
    assert rows(out["next"], ("info", "action")) == ["'abc'"] * N


async def test_a_rollout_of_sampled_actions(make_pool: PoolFactory) -> None:
    pool = await make_pool(envs("dict"))
    traj = await pool.rollout(4, break_when_any_done=False)
    assert traj.batch_size == (N, 4)
    for i in range(N):
        assert_observations_in_space(traj[i]["next"], ALL_SPACES["dict"])


BAD_ACTIONS = [
    ("text", ["ok", 3, "ok"], TypeError, ["env 1", "'action'", "must be a str"]),
    ("text", ["ok", "ok", "x" * 7], ValueError, ["env 2", "'action'", "length 7"]),
    ("seq_discrete", [(1,), "12", ()], TypeError, ["env 1", "'action'", "a sequence"]),
    (
        "seq_box_stacked",
        [np.zeros((1, 2), np.float32), np.zeros((0, 2), np.float32), 5],
        TypeError,
        ["env 2"],
    ),
    ("graph", ["g", "g", "g"], TypeError, ["env 0", "'action'", "GraphInstance"]),
    ("oneof", [(0, 1), (0, 2), (5, 1)], TypeError, ["env 2", "'action'", "(index, value) pair"]),
    ("oneof", [(0, 1), 1, (0, 2)], TypeError, ["env 1", "'action'", "(index, value) pair"]),
    ("custom", ["north", None, "west"], ValueError, ["env 1", "'action'", "no value"]),
]


@pytest.mark.parametrize(("space", "values", "error", "words"), BAD_ACTIONS)
async def test_an_action_of_the_wrong_kind_is_refused_before_dispatch(
    make_pool: PoolFactory, space: str, values: list[Any], error: type[Exception], words: list[str]
) -> None:
    pool = await make_pool(envs(space))
    await pool.reset()
    td = TensorDict({}, [N])
    td.set("action", non_tensor_stack(values))
    with pytest.raises(error) as caught:
        await pool.step(td)
    for word in words:
        assert word in str(caught.value)
    good = draw(space, seed=0)
    out = await pool.step(actions_td(ALL_SPACES[space], good, as_list=False))
    assert rows(out["next"], ("info", "t")) == [1] * N  # the refused step never ran


async def test_a_wrong_kind_in_a_dict_names_the_nested_key(make_pool: PoolFactory) -> None:
    pool = await make_pool(envs("dict"))
    await pool.reset()
    values = draw("dict", seed=0)
    values[2]["inner"]["graph"] = "not a graph"
    with pytest.raises(TypeError, match=r"env 2: 'action\.inner\.graph' must be a GraphInstance"):
        await pool.step(actions_td(ALL_SPACES["dict"], values, as_list=False))
    await pool.step(actions_td(ALL_SPACES["dict"], draw("dict", seed=1), as_list=False))


def test_the_sync_shim_checks_and_rolls_out_every_space(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    for space in ("dict", "seq_dict_stacked", "oneof", "custom"):
        env = SerialEnv(N, envs(space)[0], executor=executor, loop_factory=loop_factory)
        try:
            assert env.env_specs[0].observation_space == ALL_SPACES[space]
            assert [leaf.is_object for leaf in env.env_specs[0].action_leaves].count(True) > 0
            check_env_specs(env, seed=0)  # sampled actions accepted, observations in their spaces
            traj = env.rollout(3, break_when_any_done=False)
            assert traj.batch_size == (N, 3)
        finally:
            env.close()


def test_check_env_specs_finds_a_text_observation_outside_its_space(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    env = SerialEnv(2, OutOfSpaceTextEnv, executor=executor, loop_factory=loop_factory)
    try:
        with pytest.raises(EnvSpecError, match=r"env 0 .*'observation' in the step output .* is not in"):
            check_env_specs(env)
    finally:
        env.close()

"""What a collector's policy may answer and the errors it gets otherwise (what it returned,
what was expected, for which envs); plain tasks; a collection right after an env error
waits for the env's rebuild."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

import aenvs
from aenvs import AsyncEnvPool, EnvError
from aenvs._tensors import non_tensor_values
from tests.collect.collect_envs import PromptEnv, counting
from tests.collect.test_collect import check_episode, first_action
from tests.conftest import PoolFactory


def rewrites_env_index(td: TensorDictBase) -> TensorDictBase:
    td["env_index"] = td["env_index"].flip(0)
    td["action"] = torch.zeros(td.batch_size[0], dtype=torch.int64)
    return td


def rewrites_env_index_in_place(td: TensorDictBase) -> list[int]:
    td["env_index"].add_(1)
    return [0] * td.batch_size[0]


def writes_nothing(td: TensorDictBase) -> None:
    return None


BAD_POLICIES: dict[str, tuple[Any, type[Exception], str]] = {
    "text for a Discrete space": (
        lambda td: ["go"] * td.batch_size[0],
        TypeError,
        r"'action' are a list of str values, expected numbers of shape \(\) and dtype int64 per env.*"
        r"Discrete\(2\).*the policy's answer for envs \[0, 1, 2\]: a list of 3 values: \['go', 'go', 'go'\]",
    ),
    "None for a Discrete space": (
        lambda td: [None] * td.batch_size[0],
        TypeError,
        r"a list of NoneType values, expected numbers.*Discrete\(2\).*envs \[0, 1, 2\]: a list of 3 values: \[None",
    ),
    "one int for the batch": (
        lambda td: 1,
        TypeError,
        r"the policy returned int 1 for envs \[0, 1, 2\]; expected the actions one per env \(a list or a "
        r"tensor of 3 rows\)",
    ),
    "one str for the batch": (
        lambda td: "go",
        TypeError,
        r"the policy returned str 'go' for envs \[0, 1, 2\]; expected the actions one per env",
    ),
    "a dict with too few rows": (
        lambda td: {"action": torch.zeros(1, dtype=torch.int64)},
        ValueError,
        r"the policy returned a tensor of shape \[1\] and dtype torch.int64 as 'action' for envs \[0, 1, 2\]; "
        r"expected one row per env \(3 rows\)",
    ),
    "a list too short": (
        lambda td: [0],
        ValueError,
        r"the policy returned a list of 1 value: \[0\] for envs \[0, 1, 2\]; expected one action per env \(3 rows\)",
    ),
    "float actions for a Discrete space": (
        lambda td: torch.zeros(td.batch_size[0]),
        ValueError,
        r"'action' has dtype torch.float32, expected torch.int64 .*Discrete\(2\) \(the policy's answer for envs "
        r"\[0, 1, 2\]: a tensor of shape \[3\] and dtype torch.float32\)",
    ),
    "env_index rewritten": (
        rewrites_env_index,
        ValueError,
        r"the policy changed 'env_index' for envs \[0, 1, 2\] \(to \[2, 1, 0\]\).*leave 'env_index' as given",
    ),
    "env_index changed in place": (
        rewrites_env_index_in_place,
        ValueError,
        r"the policy changed 'env_index' for envs \[0, 1, 2\] \(to \[1, 2, 3\]\)",
    ),
    "no action written": (
        writes_nothing,
        KeyError,
        r"no 'action' entry for envs \[0, 1, 2\]: write td\['action'\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_POLICIES))
async def test_a_bad_policy_answer_says_what_it_returned_and_what_was_expected(case: str) -> None:
    policy, error, match = BAD_POLICIES[case]
    async with AsyncEnvPool([counting] * 3, executor="inline") as pool:
        with pytest.raises(error, match=match):
            async for _ in aenvs.collect(pool, policy, total_episodes=3):
                pass
        assert (await pool.reset()).batch_size == torch.Size([3])  # usable after


async def test_a_dict_of_entries_is_an_answer(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)

    def policy(td: TensorDictBase) -> dict[str, Any]:
        k = td.batch_size[0]
        return {"action": torch.ones(k, dtype=torch.int64), "extra": {"value": [0.5] * k}}

    episodes = [e async for e in aenvs.collect(pool, policy, total_episodes=4)]
    for e in episodes:
        check_episode(e)
        assert (e.td["action"] == 1).all() and (e.td["extra", "value"] == 0.5).all()


async def test_plain_tasks_reach_the_env_as_the_task_option(make_pool: PoolFactory) -> None:
    pool = await make_pool([PromptEnv] * 2)

    def policy(td: TensorDictBase) -> list[str]:
        return ["a"] * td.batch_size[0]

    prompts = ["p0", "p1", "p2"]
    episodes = [e async for e in aenvs.collect(pool, policy, tasks=prompts)]
    assert sorted(e.task for e in episodes) == prompts  # the task as given
    for e in episodes:
        assert non_tensor_values(e.td["observation"])[0] == e.task  # read as options["task"]
    for bad in ("p0", {"prompt": "p0"}):
        with pytest.raises(TypeError, match=r"tasks must be an iterable of tasks .* got a (str|dict)"):
            aenvs.collect(pool, policy, tasks=bad)  # pyright: ignore[reportArgumentType]


async def test_reset_options_that_are_not_a_dict_are_refused_by_name(make_pool: PoolFactory) -> None:
    pool = await make_pool([PromptEnv] * 2)
    match = r"reset options must be a dict .* got str 'p1'; pass options=\{'task': 'p1'\}"
    with pytest.raises(TypeError, match=match):
        await pool.reset(options="p1")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=match):
        await pool.async_reset_send(env_index=[0], options="p1")  # pyright: ignore[reportArgumentType]
    out = await pool.reset(options={"task": "p1"})  # nothing was dispatched: the pool is usable
    assert non_tensor_values(out["observation"]) == ["p1", "p1"]


async def test_a_collection_right_after_an_env_error_waits_for_the_rebuild(make_pool: PoolFactory) -> None:
    # the failed env is rebuilt after a second's backoff: the next collection starts meanwhile
    pool = await make_pool([counting] * 2, on_error="restart", restart_backoff=1.0)
    tasks = [{"tag": 0, "length": 3, "fail_at": 1}, {"tag": 1, "length": 3}]
    with pytest.raises(EnvError) as caught:
        async for _ in aenvs.collect(pool, first_action, tasks=tasks):
            pass
    failed = caught.value.env_index
    episodes = [e async for e in aenvs.collect(pool, first_action, total_episodes=4)]
    assert len(episodes) == 4
    for e in episodes:
        check_episode(e)
    assert pool.stats().restarts[failed] == 1

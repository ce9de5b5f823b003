"""Partial steps (``"_step"`` masks) of a pool whose timeouts truncate: every row of the
output has the ``("next", "timed_out")`` flag, dense or lazily stacked, when the mask steps
some envs or none, on every executor."""

from __future__ import annotations

import time

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenvs import step_mdp
from tests.faults.deadline_envs import hanging_env_fns
from tests.faults.test_deadlines import column, nothing_left, past_deadline

pytestmark = pytest.mark.timeout(90)

DEADLINE = 0.2


def masked(td: TensorDictBase, mask: list[bool]) -> TensorDictBase:
    td = td.copy()
    td["action"] = torch.ones(len(mask), dtype=torch.long)
    td["_step"] = torch.tensor(mask)
    return td


@pytest.mark.parametrize("stack", ["dense", "lazy"])
async def test_every_row_of_a_partial_step_has_the_timed_out_flag(make_pool, stack: str) -> None:
    fns = hanging_env_fns(3, {}, "", asynchronous=False)
    pool = await make_pool(fns, stack=stack, episode_timeout=DEADLINE, on_timeout="truncate")
    td = await pool.reset()
    since = time.perf_counter()
    for and_reset in (False, True):  # a mask that steps no env: the inputs, flagged
        if and_reset:
            out, next_td = await pool.step_and_maybe_reset(masked(td, [False] * 3))
            assert "timed_out" not in next_td.keys()  # the next step's input, not a result
        else:
            out = await pool.step(masked(td, [False] * 3))
        assert isinstance(out, LazyStackedTensorDict) == (stack == "lazy")
        assert column(out, "timed_out") == [False] * 3
        assert column(out, "position") == [0.0] * 3
    await past_deadline(since, DEADLINE)  # every episode is over: a step sent now is not run
    out = await pool.step(masked(td, [False, True, False]))
    assert isinstance(out, LazyStackedTensorDict) == (stack == "lazy")
    assert column(out, "timed_out") == [False, True, False]
    assert column(out, "truncated") == [False, True, False]
    # an env left out keeps its input, the flag too: env 1 again, not stepped this time
    out = await pool.step(masked(step_mdp(out), [True, False, False]))
    assert column(out, "timed_out") == [True, True, False]
    assert column(out, "truncated") == [True, True, False]
    await nothing_left(pool)
    assert pool.stats().timeouts == [1, 1, 0]

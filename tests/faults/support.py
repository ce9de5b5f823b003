"""What the fault scenarios share: a bound on every wait, applicability, result collection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack

from aenvs import AsyncEnvPool, EnvError
from tests.conftest import EXECUTORS

WAIT = 30.0  # no scenario waits longer for anything: a hang fails the test, not CI


def _name(param: Any) -> str:
    return param.values[0] if hasattr(param, "values") else param


def applies_to(*executors: str) -> Callable[[Any], Any]:
    """Run a scenario on these executors only (among those the suite runs on)."""
    return pytest.mark.parametrize("executor", [e for e in EXECUTORS if _name(e) in executors])


def echo_actions(
    n: int, env_index: list[int] | None = None, shape: tuple[int, ...] | None = None
) -> TensorDict:
    """Actions of 1.0 for ``n`` echo envs (float64 ``[n, 1]`` unless ``shape`` says otherwise)."""
    td = TensorDict(action=torch.ones(shape or (n, 1), dtype=torch.float64), batch_size=[n])
    if env_index is not None:
        td["env_index"] = torch.tensor(env_index)
    return td


async def collect(pool: AsyncEnvPool, n: int) -> tuple[TensorDictBase, list[EnvError]]:
    """Receive ``n`` step answers: the results (sorted by env) and the errors (sorted by env)."""
    parts: list[TensorDictBase] = []
    errors: list[EnvError] = []
    got = 0
    async with asyncio.timeout(WAIT):
        while got < n:
            try:
                out = await pool.async_step_recv(min_get=1)
            except EnvError as error:
                errors.append(error)
                got += 1
                continue
            parts.append(out)
            got += out.batch_size[0]
    assert parts, "no result at all"
    results = lazy_stack([td for part in parts for td in part.unbind(0)]).contiguous()
    order = results.get("env_index").argsort()
    return results[order], sorted(errors, key=lambda e: e.env_index)

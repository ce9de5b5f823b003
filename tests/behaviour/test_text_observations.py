"""Text observations are checked against their ``Text`` space, as array observations are
against their ``Box``: a value that is not a str is always its env's error; one too long or
short, or with a character outside the charset, where the pool checks values
(``check_finite=True``). The other envs' results arrive, and the pool stays usable."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from aenvs import AsyncEnvPool, EnvError
from tests.behaviour.language_envs import SaysEnv
from tests.conftest import PoolFactory


async def run_stage(pool: AsyncEnvPool, stage: str) -> tuple[dict[int, Any], dict[int, EnvError]]:
    """Send the envs' ``stage`` (their reset, step, or step and reset) and take every answer:
    each env's observation, or its error."""
    n = pool.num_envs
    if stage == "reset":
        await pool.async_reset_send()
    else:
        td = await pool.reset()
        td["action"] = torch.zeros(n, dtype=torch.int64)
        if stage == "step":
            await pool.async_step_send(td)
        else:
            await pool.async_step_and_maybe_reset_send(td)
    observations: dict[int, Any] = {}
    errors: dict[int, EnvError] = {}
    while len(observations) + len(errors) < n:
        try:
            if stage == "reset":
                out = await pool.async_reset_recv(min_get=1)
                values = out["observation"]
            elif stage == "step":
                out = await pool.async_step_recv(min_get=1)
                values = out["next", "observation"]
            else:
                _, out = await pool.async_step_and_maybe_reset_recv(min_get=1)
                values = out["observation"]
        except EnvError as error:
            errors[error.env_index] = error
            continue
        observations.update(zip(out["env_index"].tolist(), values, strict=True))
    return observations, errors


# what the healthy envs (SaysEnv(), whose episodes go on) observe after each stage
FINE = {"reset": "start", "step": "fine", "autoreset": "fine"}


@pytest.mark.parametrize(("bad", "stage"), [(None, "reset"), (b"ab", "step"), (5, "autoreset")])
async def test_a_text_observation_that_is_not_a_str_is_its_envs_error(
    make_pool: PoolFactory, bad: Any, stage: str
) -> None:
    pool = await make_pool([SaysEnv, functools.partial(SaysEnv, bad, stage), SaysEnv])
    observations, errors = await run_stage(pool, stage)
    assert observations == {0: FINE[stage], 2: FINE[stage]}
    assert list(errors) == [1]
    message = str(errors[1])
    for word in ("env 1", "'observation'", type(bad).__name__, "Text(1, 8", "holds a str"):
        assert word in message
    assert await pool.get_attr("says", env_index=[0]) == ["fine"]  # the pool stays usable


@pytest.mark.parametrize(
    ("bad", "stage", "checked", "words"),
    [
        ("x" * 20, "step", True, ["length 20"]),
        ("a b!", "reset", True, ["length 4", "characters outside its charset [' ', '!']"]),
        ("a b!", "autoreset", True, ["characters outside its charset [' ', '!']"]),
        ("x" * 20, "step", False, None),  # no value checks: the text comes back as the env said it
    ],
)
async def test_a_text_observation_outside_its_space_is_its_envs_error_when_checked(
    make_pool: PoolFactory, bad: str, stage: str, checked: bool, words: list[str] | None
) -> None:
    pool = await make_pool([SaysEnv, functools.partial(SaysEnv, bad, stage)], check_finite=checked)
    observations, errors = await run_stage(pool, stage)
    if words is None:
        assert observations == {0: FINE[stage], 1: bad} and not errors
        return
    assert observations == {0: FINE[stage]} and list(errors) == [1]
    message = str(errors[1])
    for word in ("env 1", f"{bad[:40]!r} in 'observation'", "Text(1, 8", "check_finite=True", *words):
        assert word in message

"""A vector env's whole-batch receives from its pool: every env's result, or none taken.

When an env's result is an error, the other envs' results of the batch are received (and
dropped) before the error is raised, so that the next command finds every env free, as
gymnasium's vector envs leave them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aenvs._errors import EnvError

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["free_others", "receive_all", "receive_all_columns"]

Receive = Callable[..., Any]
"""An ``AsyncEnvPool`` receive (``async_step_recv``, ``async_reset_recv``, ``async_step_recv_columns``)."""


async def receive_all(recv: Receive, rows: list[int], timeout: float | None) -> TensorDictBase:
    """The results of ``rows`` by ``recv``, in that order, within ``timeout`` seconds."""
    try:
        return await recv(env_index=rows, timeout=timeout)
    except EnvError:
        await free_others(recv, rows)
        raise


async def receive_all_columns(
    recv_columns: Receive, recv: Receive, num_envs: int
) -> dict[tuple[str, ...], Any]:
    """Every env's step result as columns by ``recv_columns`` (the pool's
    ``async_step_recv_columns``), sorted by env; every env was sent a step. On an env's
    error, the others' results are received by ``recv`` (``async_step_recv``)."""
    try:
        return await recv_columns(min_get=num_envs)  # any num_envs results: cheaper than naming them
    except EnvError:
        await free_others(recv, list(range(num_envs)))
        raise


async def free_others(recv: Receive, rows: list[int]) -> None:
    """After an env's error: receive the results the other envs of ``rows`` still owe."""
    for i in rows:
        try:
            await recv(env_index=[i])
        except (EnvError, ValueError):
            pass

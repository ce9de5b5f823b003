"""aenvs: an asyncio-first pool of RL environments.

Example:
    >>> import asyncio, torch
    >>> from aenvs import AsyncEnvPool
    >>> async def main():
    ...     async with AsyncEnvPool("CartPole-v1", num_envs=4) as pool:
    ...         td = await pool.reset()
    ...         td["action"] = torch.randint(0, 2, (4,))
    ...         await pool.async_step_send(td)
    ...         return await pool.async_step_recv(min_get=4)
"""

from __future__ import annotations

from aenvs.env import Env as Env, EnvContext as EnvContext, EnvState as EnvState
from aenvs.errors import (
    AenvsError as AenvsError,
    EnvBusyError as EnvBusyError,
    EnvCrashedError as EnvCrashedError,
    EnvError as EnvError,
    EnvTimeoutError as EnvTimeoutError,
    PoolClosedError as PoolClosedError,
)
from aenvs.layout import step_mdp as step_mdp
from aenvs.pool import AsyncEnvPool as AsyncEnvPool, PoolStats as PoolStats
from aenvs.specs import EnvSpec as EnvSpec

__version__ = "0.1.0"

__all__ = [
    "AenvsError",
    "AsyncEnvPool",
    "Env",
    "EnvBusyError",
    "EnvContext",
    "EnvCrashedError",
    "EnvError",
    "EnvSpec",
    "EnvState",
    "EnvTimeoutError",
    "PoolClosedError",
    "PoolStats",
    "step_mdp",
]

"""aenvs: an asyncio-first pool of RL environments.

Example:
    >>> import asyncio, torch
    >>> from aenvs import AsyncEnvPool
    >>> async def main():
    ...     async with AsyncEnvPool("CartPole-v1", num_envs=4) as pool:
    ...         td = await pool.reset()
    ...         td["action"] = torch.randint(0, 2, (4,))
    ...         await pool.async_step_send(td)
    ...         out = await pool.async_step_recv(min_get=4)
    ...     return out["next", "reward"].shape
    >>> asyncio.run(main())
    torch.Size([4, 1])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aenvs._env import Env as Env, EnvContext as EnvContext, EnvState as EnvState
from aenvs._errors import (
    AenvsError as AenvsError,
    EnvBusyError as EnvBusyError,
    EnvCrashedError as EnvCrashedError,
    EnvError as EnvError,
    EnvTimeoutError as EnvTimeoutError,
    PoolClosedError as PoolClosedError,
)
from aenvs._rate_limit import RateLimit as RateLimit
from aenvs._specs import EnvSpec as EnvSpec

if TYPE_CHECKING:
    from aenvs._adapters.multi_agent import MultiAgent as MultiAgent
    from aenvs._check import check_env_specs as check_env_specs
    from aenvs._collect import (
        Collector as Collector,
        Episode as Episode,
        FrameBatch as FrameBatch,
        collect as collect,
    )
    from aenvs._layout import step_mdp as step_mdp
    from aenvs._pool import AsyncEnvPool as AsyncEnvPool, PoolStats as PoolStats
    from aenvs._serving import (
        AsyncPolicyClient as AsyncPolicyClient,
        EnvServer as EnvServer,
        PolicyClient as PolicyClient,
        PolicyServerError as PolicyServerError,
        serve as serve,
    )
    from aenvs._sync import ParallelEnv as ParallelEnv, SerialEnv as SerialEnv

__version__ = "0.1.0"

__all__ = [
    "AenvsError",
    "AsyncEnvPool",
    "AsyncPolicyClient",
    "Collector",
    "Env",
    "EnvBusyError",
    "EnvContext",
    "EnvCrashedError",
    "EnvError",
    "EnvServer",
    "EnvSpec",
    "EnvState",
    "EnvTimeoutError",
    "Episode",
    "FrameBatch",
    "MultiAgent",
    "ParallelEnv",
    "PolicyClient",
    "PolicyServerError",
    "PoolClosedError",
    "PoolStats",
    "RateLimit",
    "SerialEnv",
    "check_env_specs",
    "collect",
    "serve",
    "step_mdp",
]

# Names whose modules import torch load on first use, so that worker processes, which
# import aenvs submodules to host gymnasium envs, never pay for torch.
_LAZY = {
    "AsyncEnvPool": "aenvs._pool",
    "PoolStats": "aenvs._pool",
    "step_mdp": "aenvs._layout",
    "SerialEnv": "aenvs._sync",
    "ParallelEnv": "aenvs._sync",
    "check_env_specs": "aenvs._check",
    "collect": "aenvs._collect",
    "Collector": "aenvs._collect",
    "Episode": "aenvs._collect",
    "FrameBatch": "aenvs._collect",
    "MultiAgent": "aenvs._adapters.multi_agent",
    # envs that connect in: the serve extra (websockets), imported on first use
    "serve": "aenvs._serving",
    "EnvServer": "aenvs._serving",
    "PolicyClient": "aenvs._serving",
    "AsyncPolicyClient": "aenvs._serving",
    "PolicyServerError": "aenvs._serving",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aenvs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

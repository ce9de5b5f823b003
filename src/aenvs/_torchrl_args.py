"""The constructor arguments of TorchRL's batched envs, read for aenvs's :class:`~aenvs.SerialEnv`
and :class:`~aenvs.ParallelEnv`: one factory per env, and the options aenvs accepts but ignores.

Example:
    >>> fns, make_kwargs = env_factories(2, "CartPole-v1", {"max_episode_steps": 10})
    >>> fns, make_kwargs
    (['CartPole-v1', 'CartPole-v1'], [{'max_episode_steps': 10}, {'max_episode_steps': 10}])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from aenvs._env import EnvFn

__all__ = ["TORCHRL_NO_OPS", "check_options", "env_factories"]

# TorchRL BatchedEnvBase arguments that have no meaning here (aenvs decides memory
# layout, devices and start methods itself); accepted so TorchRL scripts run unchanged.
TORCHRL_NO_OPS = frozenset(
    {
        "pin_memory",
        "share_individual_td",
        "shared_memory",
        "memmap",
        "policy_proof",
        "allow_step_when_done",
        "num_threads",
        "num_sub_threads",
        "serial_for_single",
        "non_blocking",
        "mp_start_method",
        "use_buffers",
        "consolidate",
        "daemon",
    }
)


def check_options(owner: str, options: Mapping[str, Any], device: str | torch.device | None) -> None:
    """Raise unless ``options`` are TorchRL batched-env arguments aenvs ignores and ``device`` is the CPU.

    Example:
        >>> check_options("SerialEnv", {"shared_memory": True}, "cpu")
        >>> check_options("SerialEnv", {"colour": "red"}, None)
        Traceback (most recent call last):
        TypeError: SerialEnv() got unexpected keyword arguments ['colour']
    """
    unknown = set(options) - TORCHRL_NO_OPS
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword arguments {sorted(unknown)}")
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"aenvs envs produce CPU tensors; device={device!r} is not supported")


def env_factories(
    num_workers: int,
    create_env_fn: EnvFn | Sequence[EnvFn],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> tuple[list[EnvFn], list[dict[str, Any]] | None]:
    """One factory per env (with its kwargs bound), and gymnasium make kwargs for id strings."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if isinstance(create_env_fn, str) or callable(create_env_fn):
        fns: list[EnvFn] = [create_env_fn] * num_workers
    else:
        fns = list(create_env_fn)
        if len(fns) != num_workers:
            raise ValueError(f"num_workers={num_workers} but {len(fns)} create_env_fn were given")
    if create_env_kwargs is None:
        kwargs: list[dict[str, Any]] = [{} for _ in fns]
    elif isinstance(create_env_kwargs, Mapping):
        kwargs = [dict(create_env_kwargs) for _ in fns]
    else:
        kwargs = [dict(k) for k in create_env_kwargs]
        if len(kwargs) != num_workers:
            raise ValueError(f"num_workers={num_workers} but {len(kwargs)} create_env_kwargs were given")
    make_kwargs = [k if isinstance(fn, str) else {} for fn, k in zip(fns, kwargs, strict=True)]
    bound = [
        fn if isinstance(fn, str) or not k else functools.partial(fn, **k)
        for fn, k in zip(fns, kwargs, strict=True)
    ]
    return bound, (make_kwargs if any(make_kwargs) else None)

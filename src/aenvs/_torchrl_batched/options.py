"""TorchRL's batched-env constructor arguments, read as TorchRL reads them: which are honoured,
which are accepted and ignored (aenvs decides memory layout, buffers and processes itself), and
which are refused, with TorchRL's exception types and messages.

Example:
    >>> fns, kwargs = factories(2, dict, {"a": 1})
    >>> len(fns), kwargs
    (2, [{'a': 1}, {'a': 1}])
    >>> factories(3, [dict, dict], None)
    Traceback (most recent call last):
    RuntimeError: len(create_env_fn) and num_workers mismatch, got 2 and 3.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aenvs._torchrl_args import TORCHRL_NO_OPS

__all__ = ["IGNORED", "check_torchrl_options", "factories"]

# TorchRL arguments accepted and ignored: the sync shim's (buffers, pinned memory, thread
# counts, start methods, daemon workers: the executor's business), and the drop-in's own two
IGNORED = TORCHRL_NO_OPS | {"metadata_from_workers", "shutdown_timeout"}


def check_torchrl_options(owner: str, options: Mapping[str, Any], parallel: bool) -> None:
    """Refuse what TorchRL refuses, with its exception types; the rest of ``IGNORED`` is accepted.

    Example:
        >>> check_torchrl_options("SerialEnv", {"shared_memory": True}, parallel=False)
        >>> check_torchrl_options("SerialEnv", {"mp_start_method": "fork"}, parallel=False)
        Traceback (most recent call last):
        TypeError: Cannot use mp_start_method=fork with envs of type SerialEnv.
    """
    unknown = set(options) - IGNORED
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword arguments {sorted(unknown)}")
    if options.get("metadata_from_workers"):
        if not parallel:
            raise TypeError("metadata_from_workers=True is only supported by ParallelEnv.")
        if options.get("use_buffers"):
            raise RuntimeError(
                "metadata_from_workers=True currently requires use_buffers=False "
                "because shared buffers must be allocated before workers start."
            )
    if options.get("pin_memory"):
        raise ValueError("pin_memory for batched envs is deprecated")
    if options.get("allow_step_when_done"):
        raise ValueError("allow_step_when_done is deprecated")
    if options.get("shared_memory", True) and options.get("memmap"):
        raise RuntimeError("memmap and shared memory are mutually exclusive features.")
    if options.get("mp_start_method") is not None and not parallel:
        raise TypeError(f"Cannot use mp_start_method={options['mp_start_method']} with envs of type {owner}.")


def factories(
    num_workers: int,
    create_env_fn: Callable[..., Any] | str | Sequence[Callable[..., Any] | str],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """One factory and one kwargs dict per worker, checked as TorchRL checks them (RuntimeError)."""
    if callable(create_env_fn) or isinstance(create_env_fn, str):
        fns: list[Any] = [create_env_fn] * num_workers
    else:
        fns = list(create_env_fn)
        if len(fns) != num_workers:
            raise RuntimeError(
                f"len(create_env_fn) and num_workers mismatch, got {len(fns)} and {num_workers}."
            )
    if create_env_kwargs is None:
        kwargs: list[dict[str, Any]] = [{} for _ in range(num_workers)]
    elif isinstance(create_env_kwargs, Mapping):
        kwargs = [copy.deepcopy(dict(create_env_kwargs)) for _ in range(num_workers)]
    else:
        kwargs = [dict(k) for k in create_env_kwargs]
        if len(kwargs) != num_workers:
            raise RuntimeError(
                f"len(create_env_kwargs) and num_workers mismatch, got {len(kwargs)} and {num_workers}."
            )
    return fns, kwargs

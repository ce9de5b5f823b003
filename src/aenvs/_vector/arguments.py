"""A vector reset's arguments, checked as gymnasium's vector envs check them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

__all__ = ["ResetSeed", "reset_targets"]

ResetSeed = int | Sequence[int | None] | None
"""None, an int (env ``i`` gets ``seed + i``) or one seed per env."""


def reset_targets(
    seed: ResetSeed, options: dict[str, Any] | None, all_rows: list[int]
) -> tuple[list[int], list[int | None], dict[str, Any] | None]:
    """The envs a reset resets (``all_rows``, or those of ``options["reset_mask"]``), their
    seeds, and the options for them (without ``"reset_mask"``).

    Raises gymnasium's errors, with its messages, for seeds or a mask that do not fit.

    Example:
        >>> reset_targets(7, {"reset_mask": np.array([False, True])}, [0, 1])
        ([1], [8], {})
    """
    num_envs = len(all_rows)
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, int):
        seeds = [seed + i for i in range(num_envs)]
    else:
        seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} "
            f"but got length={len(seeds)}."
        )
    rows = all_rows
    if options is not None and "reset_mask" in options:
        options = dict(options)
        given = options.pop("reset_mask")
        if not isinstance(given, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(given)}")
        mask = cast("npt.NDArray[Any]", given)
        if mask.shape != (num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
        if not np.any(mask):
            raise ValueError(
                "`options['reset_mask']` must contain a boolean array with at least one True value, "
                f"got reset_mask={mask}"
            )
        rows = np.flatnonzero(mask).tolist()
        seeds = [seeds[i] for i in rows]
    return rows, seeds, options

"""TorchRL's deterministic seed chain, so seeded runs match it env for env."""

from __future__ import annotations

import numpy as np

__all__ = ["next_seed", "seed_chain"]

_MAX_SEED = 2**32 - 1


def next_seed(seed: int) -> int:
    """The seed that follows ``seed`` in the chain (TorchRL's ``seed_generator``).

    Example:
        >>> next_seed(0) == next_seed(0)
        True
    """
    rng = np.random.default_rng(seed)
    return int.from_bytes(rng.bytes(8), "big") % _MAX_SEED


def seed_chain(seed: int, n: int) -> tuple[list[int], int]:
    """Seeds for ``n`` envs starting at ``seed``, and the seed that comes after them.

    Example:
        >>> seeds, after = seed_chain(7, 3)
        >>> seeds[0], len(seeds), after == next_seed(seeds[-1])
        (7, 3, True)
    """
    seeds: list[int] = []
    for _ in range(n):
        seeds.append(seed)
        seed = next_seed(seed)
    return seeds, seed

"""What an adapter makes of one env's reset or step result, for the runner to write."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from aenvs._specs import Key

__all__ = ["Outcome"]


class Outcome(NamedTuple):
    """One env's reset or step result, normalised: entries plus the step scalars.

    An env with a batch shape of its own (a TorchRL env of batch size ``[3]``) gives its
    reward and done / terminated / truncated per sub-env among ``items`` (arrays of shape
    ``[*batch_shape, 1]``, written into its rows like observations); its ``terminated`` /
    ``truncated`` scalars then say whether any sub-env ended (the pool's "episode ended"
    for it), and its ``reward`` is unused. Single envs keep plain scalars: nothing changes
    on their path.
    """

    items: list[tuple[Key, Any]]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] | None = None

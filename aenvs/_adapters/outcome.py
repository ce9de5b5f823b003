"""What an adapter makes of one env's reset or step result, for the runner to write."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from aenvs._specs import Key

__all__ = ["Outcome"]


class Outcome(NamedTuple):
    """One env's reset or step result, normalised: entries plus the step scalars."""

    items: list[tuple[Key, Any]]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] | None = None

"""Receives waiting at the same time, served fairly.

Receives that wait at the same time are served fairly: a receive naming env_index
holds those envs for itself, and one for any env holds a claim on min_get of the
results not held by others. A receive that could only be satisfied by taking what
another waiting receive holds or claims is refused at once (ValueError), and every
receive takes only what leaves the others' claims whole; so none waits forever.
With no receive waiting (the usual case), none of this runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from aenvs._commands import CommandKind, Completion

__all__ = ["Receive", "WaitingReceives"]


@dataclass(eq=False, slots=True)
class Receive:
    """A receive waiting for results: of ``kind``, from ``wanted`` envs (None: any), at least ``min_get``."""

    kind: CommandKind
    wanted: list[int] | None
    min_get: int


class WaitingReceives:
    """The receives waiting now, and the envs those naming ``env_index`` hold for themselves.

    Reads the pool's own records: results in flight or ready per kind (``outstanding``),
    the ready results by env and the kind in flight per env.
    """

    def __init__(
        self,
        outstanding: Counter[CommandKind],
        ready: dict[int, Completion],
        pending: list[CommandKind | None],
    ) -> None:
        self.waiting: list[Receive] = []
        self.reserved: dict[int, Receive] = {}
        self._outstanding = outstanding
        self._ready = ready
        self._pending = pending

    def add(self, receive: Receive) -> None:
        self.waiting.append(receive)
        for i in receive.wanted or ():
            self.reserved[i] = receive

    def remove(self, receive: Receive) -> None:
        self.waiting.remove(receive)
        for i in receive.wanted or ():
            del self.reserved[i]

    def spare(self, kind: CommandKind, me: Receive | None) -> int:
        """How many results of ``kind`` a receive for any env (``me``, or a new one) may take."""
        return self.unheld(kind) - self.claimed(kind, me)

    def claimed(self, kind: CommandKind, me: Receive | None) -> int:
        """Results of ``kind`` claimed by waiting receives for any env, other than ``me``."""
        return sum(r.min_get for r in self.waiting if r is not me and r.wanted is None and r.kind is kind)

    def unheld(self, kind: CommandKind) -> int:
        """Results of ``kind`` in flight or ready that no waiting receive holds by env index."""
        reserved = self.reserved
        return self._outstanding[kind] - sum(1 for r in reserved.values() if r.kind is kind)

    def check_beside_others(self, kind: CommandKind, wanted: list[int] | None, min_get: int) -> None:
        """Refuse a receive that other waiting receives leave no way to satisfy, or that
        would take what they hold or claim."""
        for i in wanted or ():
            if i in self.reserved:
                raise ValueError(f"env {i}'s {kind.value} result is awaited by another receive already")
        unheld, claimed = self.unheld(kind), self.claimed(kind, None)
        if wanted is not None and unheld - len(wanted) < claimed:
            raise ValueError(
                f"receiving env_index={wanted} would take {kind.value} results that other waiting "
                f"receives claim ({claimed} of the {unheld} not held by env index); it would leave "
                "them waiting forever"
            )
        if wanted is None and unheld - claimed < min_get:
            raise ValueError(
                f"min_get={min_get} but only {max(unheld - claimed, 0)} {kind.value} result(s) in flight "
                f"or ready are not held or claimed by other waiting receives ({unheld - claimed} of "
                f"{self._outstanding[kind]}); this would wait forever"
            )

    def check_still_possible(self, receive: Receive) -> None:
        """Raise if ``receive`` can no longer get its results (some were dropped meanwhile)."""
        kind, wanted = receive.kind, receive.wanted
        if wanted is None:
            available = self.unheld(kind) - self.claimed(kind, receive)
        else:
            pending, ready = self._pending, self._ready
            available = sum(1 for i in wanted if pending[i] is kind or (i in ready and ready[i].kind is kind))
        if available < receive.min_get:
            raise ValueError(
                f"this receive waited for {receive.min_get} {kind.value} result(s), but only {available} "
                "can still come to it (the others were dropped: an abandoned whole-batch call's); it "
                "would wait forever"
            )

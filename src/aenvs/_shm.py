"""Shared memory with no name to leak: one anonymous file (memfd) holding every buffer.

The parent creates the file once the specs are known, maps it, and hands the file
descriptor to each worker over its pipe (SCM_RIGHTS). Nothing ever appears in
``/dev/shm``; the memory is freed when the last process mapping it exits, whatever
way it exits.
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
from collections.abc import Sequence

import numpy as np

from aenvs._buffers import Buffers
from aenvs._specs import EnvSpec

__all__ = ["SharedArena"]

_ALIGN = 64  # cache-line aligned rows keep workers from sharing lines at group edges


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("aenvs", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as handle:  # unlinked at once: nothing to leak either
        return os.dup(handle.fileno())


class _Carver:
    """An allocator that lays buffers out one after the other in a mapping (or only measures)."""

    def __init__(self, memory: mmap.mmap | None) -> None:
        self.memory = memory
        self.offset = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        start = -(-self.offset // _ALIGN) * _ALIGN
        self.offset = start + math.prod(shape) * dtype.itemsize
        if self.memory is None:
            return np.broadcast_to(np.zeros((), dtype), shape)
        return np.ndarray(shape, dtype, buffer=self.memory, offset=start)


class SharedArena:
    """The shared buffers of a pool, laid out identically in the parent and every worker.

    Example:
        >>> from gymnasium import spaces
        >>> specs = [EnvSpec.from_spaces(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))] * 2
        >>> arena = SharedArena.create(specs)
        >>> arena.buffers.groups[0].step[("observation",)].shape
        (2, 3)
        >>> arena.close_fd()
    """

    def __init__(self, fd: int, size: int, specs: Sequence[EnvSpec]) -> None:
        self.fd = fd
        self.size = size
        self.memory = mmap.mmap(fd, max(size, 1))
        self.buffers = Buffers.allocate(specs, _Carver(self.memory))

    @staticmethod
    def size_of(specs: Sequence[EnvSpec]) -> int:
        carver = _Carver(None)
        Buffers.allocate(specs, carver)
        return carver.offset

    @classmethod
    def create(cls, specs: Sequence[EnvSpec]) -> SharedArena:
        size = cls.size_of(specs)
        fd = _anonymous_file()
        os.ftruncate(fd, max(size, 1))
        return cls(fd, size, specs)

    @classmethod
    def attach(cls, fd: int, size: int, specs: Sequence[EnvSpec]) -> SharedArena:
        """Map an arena whose descriptor was received from the parent."""
        return cls(fd, size, specs)

    def close_fd(self) -> None:
        """Drop the descriptor (the mapping stays valid; the memory lives while mapped)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

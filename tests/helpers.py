"""Small envs and helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import psutil
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvContext
from aenvs.testing import EchoEnv


def actions(values: list[float], env_index: list[int] | None = None) -> TensorDict:
    """An EchoEnv action batch (float64 [k, 1]), optionally with env_index."""
    td = TensorDict(action=torch.tensor(values, dtype=torch.float64).reshape(-1, 1), batch_size=[len(values)])
    if env_index is not None:
        td["env_index"] = torch.tensor(env_index)
    return td


async def until(condition: Any, timeout: float = 30.0) -> None:
    """Yield to the loop until ``condition()`` holds (at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


class Gate:
    """A latch that works across threads and processes: open once the file exists."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"gate-{uuid.uuid4().hex}")

    def open(self) -> None:
        with open(self.path, "w"):
            pass

    def wait(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True


class GatedEnv(EchoEnv):
    """EchoEnv whose step waits (off the loop) until the test opens its gate; with
    ``fail_at_once``, a negative action fails at once instead."""

    def __init__(self, gate: Gate, env_index: int = 0, fail_at_once: bool = False) -> None:
        super().__init__(env_index=env_index)
        self.gate = gate
        self.fail_at_once = fail_at_once

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        if self.fail_at_once and float(td["action"].item()) < 0:
            return self._advance(td)  # raises
        opened = await asyncio.to_thread(self.gate.wait)
        assert opened, "the test never opened the gate"
        return self._advance(td)


def gated_env_fns(num_envs: int, gate: Gate, *, fail_at_once: bool = False) -> list[Any]:
    def make(ctx: EnvContext) -> GatedEnv:
        return GatedEnv(gate, ctx.env_index, fail_at_once)

    return [make] * num_envs


class RichSpacesEnv(gym.Env):
    """A gymnasium env with Dict / Tuple / MultiDiscrete / MultiBinary spaces and a mixed info dict."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(-1, 1, (2,), np.float32),
                "mode": gym.spaces.Discrete(3),
                "flags": gym.spaces.MultiBinary(4),
                "pair": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (3,), np.float64))),
            }
        )
        self.action_space = gym.spaces.Dict(
            {"move": gym.spaces.Box(-1, 1, (2,), np.float32), "pick": gym.spaces.MultiDiscrete([3, 4])}
        )
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        return {
            "position": np.full(2, self.t / 10, np.float32),
            "mode": self.t % 3,
            "flags": np.array([1, 0, 1, self.t % 2], np.int8),
            "pair": (self.t % 2, np.full(3, 0.5)),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"msg": "hello", "level": 1}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), action
        self.t += 1
        info = {"msg": f"step {self.t}", "speed": 0.5 * self.t, "pick": action["pick"].copy()}
        return self._obs(), float(action["move"].sum()), self.t >= 5, False, info


SHM_PREFIX = "aenvs"  # the name of aenvs's memfds, and of anything it would ever put in /dev/shm


def shm_entries() -> set[str]:
    """The entries of /dev/shm that could be aenvs's: those named ``aenvs*``.

    aenvs puts nothing there (its shared memory is one anonymous memfd per pool, named
    ``aenvs``); what other programs keep there (multiprocessing's ``sem.mp-*``, ...) is none
    of a test's business. To check what a pool's own processes held, see :func:`shared_memory_of`.
    """
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if name.startswith(SHM_PREFIX)}


class SharedMemory(NamedTuple):
    """A shared-memory file a process holds: ``path`` is ``/dev/shm/<name>``, or
    ``/memfd:<name>`` for a memfd; ``deleted`` when it has no name any more (a memfd never
    has one), so that it goes with the last process holding it."""

    path: str
    inode: int
    deleted: bool


_DELETED = " (deleted)"


def _shared(target: str, inode: int) -> SharedMemory | None:
    if not target.startswith(("/dev/shm/", "/memfd:")):
        return None
    deleted = target.endswith(_DELETED)
    return SharedMemory(target.removesuffix(_DELETED), inode, deleted or target.startswith("/memfd:"))


def shared_memory_of(pids: Iterable[int]) -> set[SharedMemory]:
    """The shared memory that the processes ``pids`` hold now, mapped or open (read from
    their ``/proc/<pid>/maps`` and ``/proc/<pid>/fd``): files in /dev/shm and memfds. The
    processes of ``pids`` that are gone hold nothing."""
    held: set[SharedMemory] = set()
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.rstrip("\n").split(maxsplit=5)
                    if len(fields) == 6 and (found := _shared(fields[5], int(fields[4]))):
                        held.add(found)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    link = f"/proc/{pid}/fd/{fd}"
                    if found := _shared(os.readlink(link), os.stat(link).st_ino):
                        held.add(found)
    return held


def left_in_dev_shm(held: Iterable[SharedMemory]) -> list[str]:
    """The files of ``held`` still in /dev/shm under their name (same inode): what the
    processes that held them left behind, once they are gone."""
    left = []
    for entry in held:
        if entry.deleted:
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.stat(entry.path).st_ino == entry.inode:
                left.append(entry.path)
    return sorted(left)


def assert_gone(pids: list[int], timeout: float = 5.0) -> None:
    """Every process of ``pids`` exits within ``timeout`` (or is gone already)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"worker processes still alive: {[p.pid for p in alive]}"

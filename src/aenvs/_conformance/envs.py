"""The envs the kit runs: each result tells which env it came from, what it was sent and
how many steps it took; some steps are ``async def``, some fail, hang or kill their worker.

The kit's own rather than aenvs.testing's EchoEnv / FaultyEnv: aenvs.testing re-exports
the kit, and no module of the package imports a sibling that imports it back (the import
contract in pyproject.toml). The factories pickle by reference, for workers elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs import Env, EnvContext
from aenvs._conformance.run import N


class InjectedFault(RuntimeError):
    """What a probe env raises for ``ProbeFault("raise")``."""


class InCallersProcess(RuntimeError):
    """Raised instead of killing the process that runs the kit, when the env runs in it."""


@dataclass(frozen=True)
class ProbeFault:
    """What goes wrong in a probe env, at its ``at``-th step (counted per env instance)."""

    kind: Literal["raise", "hang", "sigkill"]
    at: int = 1
    gate: str | None = None  # "hang" (async envs only): until this file exists


class ProbeEnv(Env):
    """Observation ``[env_index, last action, steps since reset]``, reward = action: each
    result tells which env it came from, what it was sent and how many steps it took."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)

    def __init__(
        self, env_index: int, delay: tuple[float, float], fault: ProbeFault | None, caller_pid: int
    ) -> None:
        self.env_index = env_index
        self.delay = delay
        self.fault = fault
        self.caller_pid = caller_pid
        self.steps = 0  # since the last reset
        self.step_count = 0  # since this instance was built
        self.label: Any = None  # for set_attr
        self.ran_on: list[tuple[int, int]] = []  # (pid, thread) of each reset and step
        self._rng = random.Random(env_index)

    def observe(self, action: float) -> torch.Tensor:
        return torch.tensor([float(self.env_index), action, float(self.steps)], dtype=torch.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        self.ran_on.append((os.getpid(), threading.get_ident()))
        self.steps = 0
        return TensorDict(observation=self.observe(0.0))

    def _pause(self) -> float:
        low, high = self.delay
        return self._rng.uniform(low, high) if high > 0 else 0.0

    def _advance(self, action: float) -> TensorDictBase:
        self.ran_on.append((os.getpid(), threading.get_ident()))
        fault = self.fault
        if fault is not None and fault.at == self.step_count:
            if fault.kind == "raise":
                raise InjectedFault(f"env {self.env_index}: injected fault at step {self.step_count}")
            if fault.kind == "sigkill":
                if os.getpid() == self.caller_pid:
                    raise InCallersProcess(
                        f"env {self.env_index} runs in the caller's process: not killing it"
                    )
                os.kill(os.getpid(), signal.SIGKILL)
        self.steps += 1
        return TensorDict(
            observation=self.observe(action),
            reward=torch.tensor([action], dtype=torch.float32),
            terminated=torch.tensor([False]),
        )

    def step(self, td: TensorDictBase) -> TensorDictBase:
        self.step_count += 1
        action = float(td["action"].reshape(-1)[0])
        pause = self._pause()
        if pause:
            time.sleep(pause)
        return self._advance(action)


class AsyncProbeEnv(ProbeEnv):
    """:class:`ProbeEnv` with an ``async def step``; its ``"hang"`` awaits, so the loop stays free."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        self.step_count += 1
        action = float(td["action"].reshape(-1)[0])
        fault = self.fault
        if fault is not None and fault.kind == "hang" and fault.at == self.step_count:
            # a file: the latch that threads, processes and actors on this machine all see
            while fault.gate is None or not os.path.exists(fault.gate):  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.005)
        await asyncio.sleep(self._pause())
        return self._advance(action)


@dataclass(frozen=True)
class ProbeFactory:
    """Builds a probe env for ``ctx.env_index``; pickled by reference for workers elsewhere."""

    asynchronous: bool
    delay: tuple[float, float]
    fault: ProbeFault | None
    caller_pid: int

    def __call__(self, ctx: EnvContext) -> ProbeEnv:
        cls = AsyncProbeEnv if self.asynchronous else ProbeEnv
        return cls(ctx.env_index, self.delay, self.fault, self.caller_pid)


def probe_env_fns(
    asynchronous: bool | Sequence[bool] = False,
    *,
    delay: float | tuple[float, float] = 0.0,
    faults: Mapping[int, ProbeFault] | None = None,
) -> list[ProbeFactory]:
    """Factories of ``N`` probe envs: ``async def`` steps where ``asynchronous`` says (per env)."""
    kinds = [asynchronous] * N if isinstance(asynchronous, bool) else list(asynchronous)
    pause = (delay, delay) if isinstance(delay, float | int) else delay
    pid = os.getpid()
    return [ProbeFactory(kinds[i], pause, (faults or {}).get(i), pid) for i in range(N)]

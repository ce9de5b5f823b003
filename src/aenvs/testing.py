"""Deterministic envs for testing pools (yours and ours).

Each env echoes who it is and what it was sent, so a test can check that every
send got exactly its own result: the observation of :class:`EchoEnv` is
``[env_index, last action, steps taken]``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs._conformance import ConformanceError, ConformanceReport, check_executor, check_executor_sync
from aenvs._env import Env, EnvContext
from aenvs._worker import WORKER_ENV_VAR

__all__ = [
    "AsyncEchoEnv",
    "AsyncFaultyEnv",
    "ConformanceError",
    "ConformanceReport",
    "EchoEnv",
    "Fault",
    "FaultyEnv",
    "InjectedFault",
    "UnpicklableError",
    "UnrebuildableError",
    "check_executor",
    "check_executor_sync",
    "echo_env_fns",
    "faulty_env_fns",
]


class EchoEnv(Env):
    """A plain env whose observation is ``[env_index, last action, steps taken]``.

    Args:
        env_index: echoed in every observation.
        delay: seconds each step sleeps (``time.sleep``); a ``(low, high)`` pair draws
            uniformly per step.
        episode_length: steps after which the episode terminates (None: never).
        fail_on_negative: raise ValueError when the action is negative (error injection).

    Example:
        >>> env = EchoEnv(env_index=2)
        >>> env.reset()["observation"].tolist()
        [2.0, 0.0, 0.0]
    """

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)

    def __init__(
        self,
        env_index: int = 0,
        delay: float | tuple[float, float] = 0.0,
        episode_length: int | None = None,
        fail_on_negative: bool = True,
    ) -> None:
        self.env_index = env_index
        self.delay = delay
        self.episode_length = episode_length
        self.fail_on_negative = fail_on_negative
        self.steps = 0
        self.resets = 0
        self.closed = False
        self._rng = random.Random(env_index)

    def _delay(self) -> float:
        if isinstance(self.delay, tuple):
            return self._rng.uniform(*self.delay)
        return self.delay

    def _obs(self, action: float) -> torch.Tensor:
        return torch.tensor([float(self.env_index), action, float(self.steps)], dtype=torch.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        """Start an episode: observation ``[env_index, 0, 0]`` (``seed`` and ``options`` are ignored)."""
        self.steps = 0
        self.resets += 1
        return TensorDict(observation=self._obs(0.0))

    def _advance(self, td: TensorDictBase) -> TensorDictBase:
        action = float(td["action"].item())
        if self.fail_on_negative and action < 0:
            raise ValueError(f"EchoEnv {self.env_index} got the negative action {action}")
        self.steps += 1
        done = self.episode_length is not None and self.steps >= self.episode_length
        return TensorDict(
            observation=self._obs(action),
            reward=torch.tensor([action], dtype=torch.float32),
            terminated=torch.tensor([done]),
        )

    def step(self, td: TensorDictBase) -> TensorDictBase:
        """Sleep ``delay`` (blocking), then echo ``td["action"]`` in the observation and as the reward.

        The episode terminates after ``episode_length`` steps; a negative action raises
        ValueError if ``fail_on_negative``.

        Example:
            >>> env = EchoEnv(env_index=1)
            >>> _ = env.reset()
            >>> env.step(TensorDict(action=torch.tensor([0.5], dtype=torch.float64)))["observation"].tolist()
            [1.0, 0.5, 1.0]
        """
        delay = self._delay()
        if delay:
            time.sleep(delay)
        return self._advance(td)

    def close(self) -> None:
        self.closed = True


class AsyncEchoEnv(EchoEnv):
    """:class:`EchoEnv` with an ``async def step`` that awaits ``asyncio.sleep(delay)``."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        """:meth:`EchoEnv.step`, awaiting ``asyncio.sleep(delay)`` instead of blocking."""
        delay = self._delay()
        await asyncio.sleep(delay)
        return self._advance(td)


def echo_env_fns(num_envs: int, *, asynchronous: bool = False, **kwargs: Any) -> list[Any]:
    """Factories for ``num_envs`` echo envs, each knowing its env index.

    Example:
        >>> fns = echo_env_fns(2, delay=0.001)
        >>> fns[1](EnvContext(1, 0, 2)).env_index
        1
    """
    cls = AsyncEchoEnv if asynchronous else EchoEnv

    def make(ctx: EnvContext) -> EchoEnv:
        return cls(env_index=ctx.env_index, **kwargs)

    return [make] * num_envs


# -- fault injection ---------------------------------------------------------------------

FaultKind = Literal[
    "raise",
    "hang",
    "exit",
    "sigkill",
    "bad_shape",
    "nan",
    "unpicklable",
    "keyboard_interrupt",
    "system_exit",
    "generator_exit",
]
_INTERRUPTS: dict[str, type[BaseException]] = {
    "keyboard_interrupt": KeyboardInterrupt,
    "system_exit": SystemExit,
    "generator_exit": GeneratorExit,
}


class InjectedFault(RuntimeError):
    """The exception a :class:`FaultyEnv` raises for ``Fault("raise")``."""


class UnpicklableError(RuntimeError):
    """An exception that cannot cross a process boundary: pickling it fails."""

    def __reduce__(self) -> Any:
        raise TypeError("UnpicklableError cannot be pickled")


class UnrebuildableError(RuntimeError):
    """An exception that pickles but cannot be rebuilt: its constructor needs two arguments."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")  # args == (message,): unpickling calls __init__(message)


@dataclass(frozen=True)
class Fault:
    """What goes wrong in a :class:`FaultyEnv`, where, and when.

    Attributes:
        kind: ``"raise"`` an exception; ``"hang"`` (until the file ``release`` exists, or
            forever); ``"exit"`` the process (``os._exit``) or ``"sigkill"`` it; return an
            observation of the wrong shape (``"bad_shape"``) or with a NaN (``"nan"``);
            raise an exception that cannot be pickled or rebuilt (``"unpicklable"``); raise
            ``KeyboardInterrupt``, ``SystemExit`` or ``GeneratorExit`` (``"keyboard_interrupt"``,
            ``"system_exit"``, ``"generator_exit"``).
        where: ``"init"`` (the constructor), ``"reset"`` or ``"step"``.
        at: the call (1-based count of resets or steps of this env instance) it happens at.
        always: also at every later call (default: once).
        release: for ``"hang"``, a file whose creation ends the hang.

    ``"exit"`` and ``"sigkill"`` end the whole process: they only run in a process that
    hosts envs and nothing else (a process worker or a Ray actor) and raise otherwise.

    Example:
        >>> Fault("raise", at=3).kind
        'raise'
    """

    kind: FaultKind
    where: Literal["init", "reset", "step"] = "step"
    at: int = 1
    always: bool = False
    release: str | None = None

    def due(self, where: str, count: int) -> bool:
        """Whether this fault happens at call ``count`` (1-based) of ``where``.

        Example:
            >>> fault = Fault("raise", at=2, always=True)
            >>> [fault.due("step", n) for n in (1, 2, 3)], fault.due("reset", 2)
            ([False, True, True], False)
        """
        return where == self.where and (count == self.at or (self.always and count > self.at))


class FaultyEnv(EchoEnv):
    """An :class:`EchoEnv` (observation ``[env_index, last action, steps]``) with injected faults.

    Args:
        faults: what goes wrong and when (see :class:`Fault`).
        ignore_sigterm: ignore SIGTERM (only in a process hosting envs, as for ``"exit"``),
            to check that closing a pool still ends the process.

    Example:
        >>> env = FaultyEnv(env_index=1, faults=[Fault("raise", at=2)])
        >>> _ = env.reset(); _ = env.step(TensorDict(action=torch.ones(1, dtype=torch.float64)))
        >>> env.step(TensorDict(action=torch.ones(1, dtype=torch.float64)))
        Traceback (most recent call last):
        ...
        aenvs.testing.InjectedFault: env 1: injected fault at step 2
    """

    def __init__(
        self,
        env_index: int = 0,
        faults: Sequence[Fault] = (),
        *,
        ignore_sigterm: bool = False,
        **echo_options: Any,
    ) -> None:
        super().__init__(env_index=env_index, **echo_options)
        self.faults = tuple(faults)
        self.step_count = 0
        self.reset_count = 0
        if ignore_sigterm:
            _require_env_process("ignore SIGTERM")
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._inject("init", 1, None)

    def _inject(self, where: str, count: int, result: TensorDictBase | None) -> TensorDictBase | None:
        for fault in self.faults:
            if fault.due(where, count):
                result = self._trip(fault, where, count, result)
        return result

    def _trip(
        self, fault: Fault, where: str, count: int, result: TensorDictBase | None
    ) -> TensorDictBase | None:
        what = f"env {self.env_index}: injected fault at {where} {count}"
        if fault.kind == "raise":
            raise InjectedFault(what)
        if fault.kind == "unpicklable":
            raise UnpicklableError(what) from UnrebuildableError(count, what)
        if fault.kind in _INTERRUPTS:
            raise _INTERRUPTS[fault.kind](what)
        if fault.kind == "hang":
            while fault.release is None or not os.path.exists(fault.release):
                time.sleep(0.005)
            return
        if fault.kind in ("exit", "sigkill"):
            _require_env_process(f"inject {fault.kind!r}")
            if fault.kind == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        if result is not None and fault.kind == "bad_shape":
            result["observation"] = torch.zeros(5, dtype=torch.float64)
        elif result is not None and fault.kind == "nan":
            result["observation"][1] = float("nan")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        """:meth:`EchoEnv.reset`, then the faults due at this reset."""
        self.reset_count += 1
        out = super().reset(seed=seed, options=options)
        self._inject("reset", self.reset_count, out)
        return out

    def step(self, td: TensorDictBase) -> TensorDictBase:
        """:meth:`EchoEnv.step`, then the faults due at this step."""
        self.step_count += 1
        out = super().step(td)
        self._inject("step", self.step_count, out)
        return out


class AsyncFaultyEnv(FaultyEnv):
    """:class:`FaultyEnv` with an ``async def step``: a hang awaits, so the loop stays free."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        """:meth:`AsyncEchoEnv.step` with the faults due at this step; a ``"hang"`` awaits its
        release before the step (the loop stays free), the other faults come after it."""
        self.step_count += 1
        for fault in self.faults:
            if fault.kind == "hang" and fault.due("step", self.step_count):
                # the release may come from another process: a file is the latch every executor shares
                while fault.release is None or not os.path.exists(fault.release):  # noqa: ASYNC110, ASYNC240
                    await asyncio.sleep(0.005)
        delay = self._delay()
        await asyncio.sleep(delay)
        out = self._advance(td)
        faults = tuple(f for f in self.faults if f.kind != "hang")
        for fault in faults:
            if fault.due("step", self.step_count):
                self._trip(fault, "step", self.step_count, out)
        return out


def faulty_env_fns(
    num_envs: int,
    faults: Mapping[int, Fault | Sequence[Fault]],
    *,
    asynchronous: bool = False,
    ignore_sigterm: Sequence[int] = (),
    **echo_options: Any,
) -> list[Any]:
    """Factories for ``num_envs`` envs; those in ``faults`` (by env index) fail as told.

    Example:
        >>> fns = faulty_env_fns(4, {2: Fault("raise", at=3)})
        >>> [fn(EnvContext(i, 0, 4)).faults for i, fn in enumerate(fns)][2]
        (Fault(kind='raise', where='step', at=3, always=False, release=None),)
    """
    cls = AsyncFaultyEnv if asynchronous else FaultyEnv
    by_env = {i: (f,) if isinstance(f, Fault) else tuple(f) for i, f in faults.items()}
    quiet = frozenset(ignore_sigterm)

    def make(ctx: EnvContext) -> FaultyEnv:
        i = ctx.env_index
        return cls(i, by_env.get(i, ()), ignore_sigterm=i in quiet, **echo_options)

    return [make] * num_envs


def _require_env_process(what: str) -> None:
    if not os.environ.get(WORKER_ENV_VAR):
        raise RuntimeError(
            f"refusing to {what} outside a process that only hosts envs (process or ray executor)"
        )

"""Loop drivers: a private loop by default, anyio's portal inside a running loop, and Ctrl-C
during a sync call (cancelled at the next await, KeyboardInterrupt once, the env still usable)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import uvloop
from tensordict import TensorDict

import aenvs._loop
from aenvs import EnvError, SerialEnv
from aenvs._loop import PortalLoop, PrivateLoop, make_driver, new_event_loop
from aenvs.testing import echo_env_fns
from tests.helpers import Gate, gated_env_fns
from tests.sync.sync_envs import hold_at_step_env_fn, holding_env_fn


def _actions(n: int, value: float = 1.0) -> TensorDict:
    return TensorDict(action=torch.full((n, 1), value, dtype=torch.float64), batch_size=[n])


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def test_drivers_run_coroutines() -> None:
    for driver in (make_driver(), make_driver("portal"), PrivateLoop(uvloop.new_event_loop)):
        try:
            assert driver.run(_add, 1, b=2) == 3
        finally:
            driver.close()
        driver.close()  # idempotent
        assert driver.closed
        with pytest.raises(RuntimeError, match="closed"):
            driver.run(_add, 1, 2)
    with pytest.raises(ValueError, match="loop must be"):
        make_driver("elsewhere")  # type: ignore[arg-type]


def test_private_loop_is_the_default_in_sync_code() -> None:
    with SerialEnv(2, echo_env_fns(2)[0]) as env:
        assert env.loop_driver.kind == "private"
        assert isinstance(env.loop_driver, PrivateLoop)
    assert _loop_type() is asyncio.SelectorEventLoop  # main thread: asyncio's loop is cheaper a call


def _loop_type() -> type:
    loop = new_event_loop()
    loop.close()
    return type(loop)


def test_private_loop_off_the_main_thread_is_uvloop() -> None:
    kinds: list[type] = []
    thread = threading.Thread(target=lambda: kinds.append(_loop_type()))
    thread.start()
    thread.join()
    assert kinds == [uvloop.Loop]


async def test_inside_a_running_loop_the_shim_uses_the_portal(executor: str) -> None:
    env = SerialEnv(2, echo_env_fns(2, fail_on_negative=False)[0], executor=executor)
    try:
        assert env.loop_driver.kind == "portal"
        assert isinstance(env.loop_driver, PortalLoop)
        env.reset()
        out = env.step(_actions(2, 3.0))
        assert out["next", "observation"][:, 1].tolist() == [3.0, 3.0]
        assert env.rollout(4, break_when_any_done=False).batch_size == (2, 4)
        env.async_step_send(_actions(2))
        assert env.async_step_recv(min_get=2).batch_size == (2,)
        assert env.env_index == [0, 1]
    finally:
        env.close()
    assert env.is_closed


def test_a_private_loop_env_called_from_a_coroutine() -> None:
    """Built in sync code, then called from inside a running loop: its loop runs in a helper thread."""
    with SerialEnv(2, echo_env_fns(2)[0], executor="thread") as env:
        env.reset()

        async def main() -> list[float]:
            return env.step(_actions(2, 4.0))["next", "observation"][:, 1].tolist()

        assert asyncio.run(main()) == [4.0, 4.0]
        assert env.step(_actions(2, 5.0))["next", "observation"][:, 1].tolist() == [5.0, 5.0]


LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_ctrl_c_during_a_sync_step(executor: str, loop_name: str, tmp_path) -> None:
    started, release = Gate(str(tmp_path)), Gate(str(tmp_path))
    env = SerialEnv(
        2, holding_env_fn(started, release), executor=executor, loop_factory=LOOP_FACTORIES[loop_name]
    )
    try:
        env.reset()

        def interrupt() -> None:
            if started.wait(30):  # the env's step has started
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                release.open()  # an inline env holds the main thread until then

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        interrupts = 0
        try:
            env.step(_actions(2))
            pytest.fail("the step was not interrupted")
        except KeyboardInterrupt:
            interrupts += 1
        interrupter.join()
        assert interrupts == 1
        # the env is usable: the interrupted step's results are dropped, the next step is its own
        out = env.step(_actions(2, 2.0))
        assert out["next", "observation"][:, 1].tolist() == [2.0, 2.0]
        assert out["next", "observation"][:, 2].tolist() == [2.0, 2.0]  # the interrupted step did happen
        traj = env.rollout(3, lambda td: td.set("action", torch.ones(2, 1, dtype=torch.float64)))
        assert traj.batch_size == (2, 3)
        assert env.steps == [3, 3]
    finally:
        began = time.monotonic()
        env.close()
        assert time.monotonic() - began < 2.0
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def _interrupting_loop(loop_name: str) -> Any:
    """A loop of ``loop_name`` that, once armed, sends SIGINT to this thread right after it
    creates the task a sync call carries on in: the handler runs before the driver records it."""
    base = uvloop.Loop if loop_name == "uvloop" else asyncio.SelectorEventLoop

    class InterruptingLoop(base):  # pyright: ignore[reportGeneralTypeIssues, reportUntypedBaseClass]
        armed = False
        sent = 0

        def create_task(self, coro: Any, **kwargs: Any) -> Any:
            task = super().create_task(coro, **kwargs)
            if self.armed and getattr(coro, "__name__", "") == "_carry_on":
                self.armed = False
                self.sent += 1
                signal.raise_signal(signal.SIGINT)
            return task

    return InterruptingLoop()


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_ctrl_c_as_a_call_moves_onto_its_loop_interrupts_it(executor: str, loop_name: str, tmp_path) -> None:
    """A Ctrl-C landing after a call's first step, before its task is recorded, still interrupts
    the call where it waits (it was lost there, and the call waited for its envs)."""
    gate = Gate(str(tmp_path))
    loop = _interrupting_loop(loop_name)
    env = SerialEnv(2, gated_env_fns(2, gate), executor=executor, loop_factory=lambda: loop)
    caught = threading.Event()

    def open_gate_at_last() -> None:  # a lost Ctrl-C leaves the step waiting for the envs
        caught.wait(30)
        gate.open()

    opener = threading.Thread(target=open_gate_at_last)
    try:
        env.reset()
        opener.start()
        loop.armed = True
        with pytest.raises(KeyboardInterrupt):
            env.step(_actions(2))
        interrupted_while_waiting = not os.path.exists(gate.path)
        caught.set()
        opener.join()
        assert loop.sent == 1
        assert interrupted_while_waiting, "the step ran to its end: the Ctrl-C was lost"
        gate.open()
        assert env.step(_actions(2))["next", "observation"].shape[0] == 2  # still usable
    finally:
        caught.set()
        gate.open()
        env.close()


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_ctrl_c_during_a_rollout_stops_it_at_the_next_step(executor: str, loop_name: str, tmp_path) -> None:
    """Ctrl-C in a rollout's step 3 of 300 surfaces at step 4's receive, on every executor: a
    rollout of plain envs on the inline executor never suspends, and still honours it."""
    started, sent = Gate(str(tmp_path)), Gate(str(tmp_path))
    env = SerialEnv(
        2, hold_at_step_env_fn(started, sent, at=3), executor=executor, loop_factory=LOOP_FACTORIES[loop_name]
    )
    try:
        env.reset()

        def interrupt() -> None:
            if started.wait(30):  # step 3 has begun: Ctrl-C, then let the step finish
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                sent.open()

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            env.rollout(300, lambda td: td.set("action", torch.ones(2, 1, dtype=torch.float64)))
        interrupter.join()
        # step 4 was sent (its results dropped) before the interrupt landed at its receive
        assert max(env.steps) <= 4, f"the rollout went on after Ctrl-C: {env.steps} steps"
        traj = env.rollout(3, lambda td: td.set("action", torch.ones(2, 1, dtype=torch.float64)))
        assert traj.batch_size == (2, 3)
        assert traj["next", "observation"][:, :, 2].tolist() == [[1.0, 2.0, 3.0]] * 2
    finally:
        env.close()


def _counting_loop(loop_name: str) -> Any:
    """A loop of ``loop_name`` that counts its ``run_until_complete`` calls (its turns)."""
    base = uvloop.Loop if loop_name == "uvloop" else asyncio.SelectorEventLoop

    class CountingLoop(base):  # pyright: ignore[reportGeneralTypeIssues, reportUntypedBaseClass]
        turns = 0

        def run_until_complete(self, future: Any) -> Any:
            self.turns += 1
            return super().run_until_complete(future)

    return CountingLoop()


@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_sync_steps_of_worker_processes_take_no_turn_of_the_loop(
    executor: str, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private loop waits for a process executor's results in the executor's own read of
    its pipes (and an inline step never waits): no loop turn per call. Every executor's steps
    come back whole and in order."""
    monkeypatch.setattr(aenvs._loop, "_WAIT_OUTSIDE", 60.0)  # a loaded machine never falls back
    loop = _counting_loop(loop_name)
    with SerialEnv(4, echo_env_fns(4), executor=executor, loop_factory=lambda: loop) as env:
        env.reset()
        turns = loop.turns
        for k in range(1, 21):
            out = env.step(_actions(4, float(k)))
            assert out["next", "observation"][:, 1].tolist() == [float(k)] * 4
        assert env.steps == [20] * 4
        if executor in ("inline", "process"):
            assert loop.turns == turns, f"{loop.turns - turns} of 20 steps turned the loop"


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
@pytest.mark.parametrize("executor", ["thread", "process", "ray"])  # an inline env holds the main thread
def test_ctrl_c_interrupts_a_step_waiting_for_its_workers(
    executor: str, loop_name: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a step waits for workers that hold on: KeyboardInterrupt before they let go,
    also while the private loop waits outside the loop (here for up to 0.5 s at a time)."""
    monkeypatch.setattr(aenvs._loop, "_WAIT_OUTSIDE", 0.5)
    started, release = Gate(str(tmp_path)), Gate(str(tmp_path))
    caught = threading.Event()
    env = SerialEnv(
        2, holding_env_fn(started, release), executor=executor, loop_factory=LOOP_FACTORIES[loop_name]
    )

    def interrupt() -> None:
        if started.wait(30):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        caught.wait(30)
        release.open()

    interrupter = threading.Thread(target=interrupt)
    try:
        env.reset()
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            env.step(_actions(2))
        interrupted_while_held = not os.path.exists(release.path)
        caught.set()
        interrupter.join()
        assert interrupted_while_held, "the step ran to its end: the Ctrl-C waited for the workers"
        out = env.step(_actions(2, 2.0))
        assert out["next", "observation"][:, 1].tolist() == [2.0, 2.0]
    finally:
        caught.set()
        release.open()
        env.close()


@pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))
def test_a_worker_killed_while_a_sync_step_waits_fails_that_step(
    loop_name: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process dies while the private loop waits outside the loop for it (for up to a
    minute here): its death is read there, and the step fails with it at once."""
    monkeypatch.setattr(aenvs._loop, "_WAIT_OUTSIDE", 60.0)
    started, release = Gate(str(tmp_path)), Gate(str(tmp_path))
    env = SerialEnv(
        2,
        holding_env_fn(started, release),
        executor="process",
        envs_per_worker=1,
        loop_factory=LOOP_FACTORIES[loop_name],
    )
    try:
        env.reset()
        pid = env.pool.executor.pids[0]  # pyright: ignore[reportAttributeAccessIssue]
        killer = threading.Thread(target=lambda: started.wait(30) and os.kill(pid, signal.SIGKILL))
        killer.start()
        began = time.monotonic()
        with pytest.raises(EnvError) as failed:
            env.step(_actions(2))
        killer.join()
        assert time.monotonic() - began < 30.0, "the step outlived its worker by the wait's minute"
        assert failed.value.env_index == 0 and "died" in str(failed.value)
    finally:
        release.open()
        env.close()


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_outside_sync_calls_is_a_plain_keyboard_interrupt() -> None:
    with SerialEnv(1, echo_env_fns(1)[0]) as env:
        env.reset()  # installs the handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)  # never reached: the handler above us raises
        assert env.step(_actions(1))["next", "observation"][0, 2] == 1.0


_DROPPED_AT_EXIT = """
import asyncio, sys
import aenvs
from aenvs.testing import echo_env_fns

async def main():
    env = aenvs.SerialEnv(2, echo_env_fns(2), executor=sys.argv[1])  # a portal: a loop runs here
    env.reset()
    raise RuntimeError("the script fails with the env open")

asyncio.run(main())
"""


def test_a_shim_left_open_in_a_failing_script_lets_it_exit(executor: str, tmp_path) -> None:
    """Collected while the interpreter shuts down (the traceback held it), after the portal's
    thread has stopped: closing must not wait on that thread's loop (it waited forever)."""
    script = tmp_path / "dropped.py"
    script.write_text(_DROPPED_AT_EXIT)
    result = subprocess.run(
        [sys.executable, str(script), executor], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1, result.stderr
    assert "the script fails with the env open" in result.stderr

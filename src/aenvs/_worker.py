"""The entry point of worker processes: host some envs, run commands from the socket.

Imports no torch (unless an env factory does), so workers hosting gymnasium envs
start in a fraction of a second and stay small. The protocol on the socket, each
message pickled in a frame (:mod:`aenvs._frames`):

    (forked by :mod:`aenvs._zygote` with the env factories already unpickled)
    worker -> parent   ("built", {env_index: EnvSpec}) or ("failed", EnvError)
    parent -> worker   one byte carrying the arena's fd (SCM_RIGHTS), then
                       (all specs, arena size, close timeout, spin wait)
    parent -> worker   Command, ...; None to stop
    worker -> parent   per command, its answers: packed (every env answered plainly) or
                       [Completion, ...] (results sit in shared memory)

A worker reads and writes blocking, one message at a time, and that cannot deadlock
with the pool however large the messages and however many are on their way: the pool
never waits on its socket (its writes go out as the socket takes them, from its event
loop, and it reads whatever arrives whenever its loop runs), so a worker stuck writing
an answer waits only for the pool's loop to read, never for the pool to finish a write.

A worker closes its envs when it stops, however it stops: told to (None), its socket gone,
or SIGTERM (which the parent sends a worker it gives up on: the command under way is
interrupted where it runs Python code, then the envs close; the parent's SIGKILL comes
``close_timeout`` later).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import sys
import time
from typing import Any

from aenvs._commands import Completion, Packed, RemoteError
from aenvs._errors import EnvError
from aenvs._frames import FrameReader, frame
from aenvs._runner import EnvRunner
from aenvs._shm import SharedArena
from aenvs._spinning import SpinWait

__all__ = ["WORKER_ENV_VAR", "worker_main"]

# Set in processes that exist only to host envs (process workers, Ray actors), so that
# faults which end or reconfigure a whole process refuse to run in the user's own.
WORKER_ENV_VAR = "AENVS_WORKER"

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when our parent dies (the zygote for a worker, the pool's
    process for the zygote), so no worker outlives its pool, even one stuck in a step."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


class _Terminated(BaseException):
    """SIGTERM arrived: the command under way stops here, and the worker closes its envs.

    Not an ``Exception`` (nor ``SystemExit``, which the runner answers as the env's own
    error): it unwinds through env code to :func:`worker_main`."""


class _Stop:
    """Whether SIGTERM arrived; its handler raises :class:`_Terminated` once."""

    terminated = False

    @classmethod
    def handler(cls, signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the closes that follow run to their end
        cls.terminated = True
        raise _Terminated


def _send(sock: socket.socket, answers: list[Completion] | Packed) -> None:
    """Send a command's answers: packed (plain answers of every env), or a Completion per env."""
    # Plain pickle, not multiprocessing's ForkingPickler: torch registers reductions there
    # that would send tensors through a resource sharer instead of by value.
    try:
        data = pickle.dumps(answers, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an env returned something that cannot travel: its result becomes an error
        assert type(answers) is list  # a packed record is plain values
        error = RemoteError.capture(exc)
        data = pickle.dumps([Completion(c.env_index, c.kind, error=error) for c in answers])
    sock.sendall(frame(data))


def worker_main(pipe_fd: int, env_args: tuple[Any, Any, Any], worker_index: int, num_envs: int) -> None:
    """Build the envs of ``env_args`` (factories, seeds, make kwargs by env index) and serve
    commands from the socket ``pipe_fd`` until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, _Stop.handler)
    os.environ[WORKER_ENV_VAR] = "process"  # this process hosts envs only (see aenvs.testing)
    die_with_parent()
    sock = socket.socket(fileno=pipe_fd)
    sock.setblocking(True)
    reader = FrameReader(sock)
    runner: EnvRunner | None = None
    try:
        env_fns, seeds, make_kwargs = env_args
        try:
            runner = EnvRunner.build(
                env_fns, num_envs=num_envs, worker_index=worker_index, seeds=seeds, make_kwargs=make_kwargs
            )
        except EnvError as err:
            sock.sendall(frame(pickle.dumps(("failed", err))))
            return
        sock.sendall(frame(pickle.dumps(("built", runner.specs))))
        carrier, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if not carrier or not fds:
            raise EOFError("the pool closed the socket before sending the shared memory")
        specs, size, runner.close_timeout, spin_wait = pickle.loads(reader.read())
        arena = SharedArena.attach(fds[0], size, specs)
        arena.close_fd()
        runner.attach({i: arena.buffers.rows(i) for i in runner.env_indices})
        spin, poller = SpinWait(spin_wait), select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        answered = 0.0  # when the last answer went out
        last: tuple[bytes | bytearray, Any] = (b"", None)  # the last command, as sent and as read
        while True:
            # the parent's next command often follows within microseconds (if not already here)
            if answered and not reader.has_frame:
                spin.poll(poller.poll)
            data = reader.read()
            if answered:
                spin.record(time.perf_counter() - answered)
            # a lockstep loop sends the same bytes batch after batch (kind and envs): read once
            command = last[1] if data == last[0] else pickle.loads(data)
            if command is None:
                break
            last = (data, command)
            answers = runner.execute(command, packed=True)
            if _Stop.terminated:  # raised inside an async env's task, which kept it as its error
                break
            _send(sock, answers)
            answered = time.perf_counter()
    except (EOFError, BrokenPipeError, ConnectionResetError, _Terminated):
        pass  # the parent is gone, or gave up on this worker: nobody to answer
    finally:
        if runner is not None:
            try:
                runner.close()
            except _Terminated:  # SIGTERM while closing (a slow close): the envs not closed yet close
                runner.close()
        sock.close()

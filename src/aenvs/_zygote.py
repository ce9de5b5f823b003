"""A fork server of our own: workers fork from a small process that already holds their code.

The zygote is one plain ``python`` process per pool-owning process, started on first
use. It imports only the worker module (numpy and gymnasium, no torch), never re-runs
the user's ``__main__``, and for each worker it unpickles the env factories *before*
forking, so the modules they need (torch for TensorDict envs, a simulator package)
are imported once in the zygote and shared by every worker it forks afterwards.

    parent ──socket──► zygote: (payload, worker index, num envs) + the worker's pipe (SCM_RIGHTS)
    zygote ──fork────► worker_main(pipe, env factories)       reply: the worker's pid

Lifetime: the zygote gets SIGKILL when the thread that started it ends (it is started
from a thread that lives exactly as long as it), and exits on EOF from its socket;
workers get SIGKILL when the zygote dies. So nothing outlives the pool's process, even
a worker stuck in a step. The zygote ignores SIGCHLD so the kernel reaps workers.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from typing import Any

__all__ = ["fork_worker", "serve", "zygote_pid"]

_HEADER = struct.Struct("!Q")
_lock = threading.Lock()
_zygote: _Client | None = None


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the socket")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _send_message(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(data)


def _recv_message(sock: socket.socket, with_fd: bool = False) -> tuple[Any, int | None]:
    if with_fd:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 1)
        if not header:
            raise EOFError("the other side closed the socket")
        header += _recv_exactly(sock, _HEADER.size - len(header))
    else:
        header, fds = _recv_exactly(sock, _HEADER.size), []
    (size,) = _HEADER.unpack(header)
    return pickle.loads(_recv_exactly(sock, size)), (fds[0] if fds else None)


_THREAD_POOLS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def _worker_environment() -> dict[str, str]:
    """One BLAS / OpenMP thread per worker unless the user says otherwise: the pool's
    parallelism is its workers, and per-worker thread pools spinning on the same cores
    slow every worker down."""
    env = dict(os.environ)
    for name in _THREAD_POOLS:
        env.setdefault(name, "1")
    return env


class _Client:
    """The parent's handle on its zygote."""

    def __init__(self) -> None:
        parent, child = socket.socketpair()
        started = threading.Event()
        self.process: subprocess.Popen[bytes] | None = None

        def keep() -> None:
            # PR_SET_PDEATHSIG fires when the *thread* that forked the zygote ends: this one
            # lives until the zygote exits, whichever thread asked for it first.
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"from aenvs._zygote import serve; serve({child.fileno()})"],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_worker_environment(),
            )
            started.set()
            self.process.wait()

        threading.Thread(target=keep, name="aenvs-zygote-keeper", daemon=True).start()
        started.wait()
        child.close()
        self.sock = parent
        _send_message(parent, list(sys.path))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def fork(self, payload: bytes, worker_index: int, num_envs: int, pipe_fd: int) -> int:
        _send_message(self.sock, (payload, worker_index, num_envs), [pipe_fd])
        reply, _ = _recv_message(self.sock)
        if isinstance(reply, BaseException):
            raise reply
        return reply


def zygote_pid() -> int | None:
    """The zygote's pid while it runs (its children are exactly the live workers)."""
    zygote = _zygote
    if zygote is None or not zygote.alive() or zygote.process is None:
        return None
    return zygote.process.pid


def fork_worker(payload: bytes, worker_index: int, num_envs: int, pipe_fd: int) -> int:
    """Fork a worker serving ``pipe_fd`` from the zygote (started on first use); return its pid.

    Blocking: the zygote unpickles ``payload`` first, which may import modules.
    """
    global _zygote
    with _lock:
        if _zygote is None or not _zygote.alive():
            _zygote = _Client()
        return _zygote.fork(payload, worker_index, num_envs, pipe_fd)


def serve(fd: int) -> None:
    """The zygote's main loop (runs in the zygote process)."""
    from aenvs._worker import die_with_parent, worker_main

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps workers: no zombies
    die_with_parent()
    sock = socket.socket(fileno=fd)
    sys.path[:] = _recv_message(sock)[0]
    importlib.import_module("cloudpickle")  # once, for every worker (it ships no type stubs)

    while True:
        try:
            (payload, worker_index, num_envs), pipe_fd = _recv_message(sock, with_fd=True)
        except (EOFError, ConnectionError):
            os._exit(0)  # the parent is gone
        assert pipe_fd is not None
        try:
            env_fns = pickle.loads(payload)  # cloudpickle's loads is pickle's
        except BaseException as exc:  # e.g. a module the factories need is not importable here
            os.close(pipe_fd)
            _send_message(
                sock, RuntimeError(f"the env factories could not be unpickled in a worker: {exc!r}")
            )
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                worker_main(pipe_fd, env_fns, worker_index, num_envs)
            except BaseException:
                code = 1
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(pipe_fd)
        _send_message(sock, pid)

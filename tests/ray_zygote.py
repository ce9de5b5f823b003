"""Ray workers forked from a process that has already imported their modules (test set-up only).

A Ray worker is a fresh interpreter: ``python setup_worker.py default_worker.py ...``
imports Ray, then an actor hosting the test envs imports torch, some 3 s of CPU per
actor on these machines, paid again by every pool of every test. The test clusters
start their nodes with this file as Ray's ``setup_worker_path``: run as a script, it
is a small shim that hands its arguments, environment and stdio to a zygote, which
has imported Ray, torch, tensordict and the aenvs modules once and forks the worker
(``default_worker.py`` run as ``__main__``). The worker registers with its raylet
under its own pid, as workers behind any shim do; the shim lives exactly as long as
its worker. Runtime environments that need Ray's own set-up go to Ray's
``setup_worker.py`` unchanged.

    raylet ─exec─► python ray_zygote.py default_worker.py --args   (the shim)
    shim ──unix socket: argv, environ, cwd + fds 0,1,2──► zygote ─fork─► Ray worker
    zygote ──worker pid──► shim: waits on the worker's pidfd, then exits
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys

SOCKET_ENV_VAR = "AENVS_TEST_RAY_ZYGOTE"
_HEADER = struct.Struct("!I")
# Not ray itself: its core reads the worker's environment (job id) when its library loads.
# Its dependencies, and what the test envs need, are imported once here.
PRELOAD = (
    "google.protobuf",
    "msgpack",
    "psutil",
    "requests",
    "jsonschema",
    "yaml",
    "filelock",
    "packaging",
    "numpy",
    "gymnasium",
    "cloudpickle",
    "torch",
    "tensordict",
    "aenvs._runner",
    "aenvs._adapters.native",
    "aenvs.testing",
    "aenvs.executors._ray_host",
)


def _send(sock: socket.socket, message: object, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(data)


def _recv(sock: socket.socket, num_fds: int = 0) -> tuple[object, list[int]]:
    fds: list[int] = []
    if num_fds:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, num_fds)
    else:
        header = sock.recv(_HEADER.size)
    while header and len(header) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(header))
        if not more:
            break
        header += more
    if len(header) < _HEADER.size:
        raise EOFError("the other side closed the socket")
    (size,) = _HEADER.unpack(header)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other side closed the socket")
        data += chunk
    return json.loads(data), fds


# -- the shim Ray starts ------------------------------------------------------------------


def _ray_setup_worker() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")


def _fall_back() -> None:
    """Let Ray's own setup_worker.py start this worker (a runtime env it must set up)."""
    os.execv(sys.executable, [sys.executable, _ray_setup_worker(), *sys.argv[1:]])


def shim() -> None:
    args = sys.argv[1:]
    context, language, rest = "{}", "", []
    for arg in args:
        if arg.startswith("--serialized-runtime-env-context="):
            context = arg.split("=", 1)[1] or "{}"
        elif arg.startswith("--language="):
            language = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    while rest and rest[0].startswith("-"):  # interpreter flags (-S, -s) before the worker's path
        rest.pop(0)
    runtime_env = json.loads(context)
    plain = not any(runtime_env.get(k) for k in ("command_prefix", "env_vars", "override_worker_entrypoint"))
    executable = runtime_env.get("py_executable")
    path = os.environ.get(SOCKET_ENV_VAR)
    if language != "PYTHON" or not plain or executable not in (None, sys.executable) or not path:
        _fall_back()
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _send(sock, {"argv": rest, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
        reply, _ = _recv(sock)
    except (OSError, EOFError):
        sock.close()
        _fall_back()
        return
    pid = int(reply)  # type: ignore[arg-type]
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    try:
        watch = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(0)
    while True:
        try:
            select.select([watch], [], [])
            break
        except InterruptedError:
            continue
    os._exit(0)


# -- the zygote ---------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the workers' modules, then fork a Ray worker for each shim that connects."""
    import contextlib
    import importlib
    import runpy
    import traceback

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            request, fds = _recv(conn, 3)
        except (OSError, EOFError):
            conn.close()
            continue
        assert isinstance(request, dict)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                server.close()
                conn.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                os.chdir(request["cwd"])
                os.environ.clear()
                os.environ.update(request["env"])
                sys.argv = list(request["argv"])
                runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 0
            except BaseException:
                code = 1
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            _send(conn, pid)
        conn.close()


if __name__ == "__main__":
    shim()

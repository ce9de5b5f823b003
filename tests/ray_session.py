"""The local Ray clusters the tests on the ray executor run on.

One driver connects to one Ray cluster at a time: the tests share a one-node cluster
(2 CPUs, no dashboard) started on first use, and tests that need a cluster of their
own (two simulated nodes) replace it for a while; the shared one starts again on next
use. Ray's logs and sockets, those of the clusters that drivers in subprocesses start
included, go to one temporary directory (``RAY_TMPDIR``), removed after the session.
The nodes start their workers through :mod:`tests.ray_zygote` (forked, not launched),
so that a pool's actors start in a fraction of a second rather than seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from tests import ray_zygote

ACTOR_PREFIX = "aenvs-"  # every actor a RayExecutor starts is named so
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Ray binds to the machine's own address unless told it is not part of a cluster:
# everything here stays on loopback. Read when ray is imported, so set before that.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# set by make test for the job that runs every test but those on Ray (one cluster at a time)
WITHOUT_RAY = "AENVS_TESTS_WITHOUT_RAY"

NODE_OPTIONS: dict[str, Any] = {
    "num_cpus": 2,
    "object_store_memory": 200 * 1024 * 1024,
    "setup_worker_path": os.path.abspath(ray_zygote.__file__),
}
DRIVER_OPTIONS: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR"}


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class LocalRay:
    """Starts and stops the local Ray clusters of the test session, and the zygote of their workers."""

    def __init__(self) -> None:
        self._temp_dir: str | None = None  # RAY_TMPDIR while the session uses Ray
        self._cluster: Any = None
        self._zygote: subprocess.Popen[str] | None = None
        self._zygote_dir: str | None = None
        self._expected_exits: list[tuple[list[int], float]] = []  # (pids, by when)

    def _start_zygote(self) -> None:
        if self._zygote is not None and self._zygote.poll() is None:
            return
        self._zygote_dir = tempfile.mkdtemp(prefix="aenvs-zygote-")
        path = os.path.join(self._zygote_dir, "sock")
        self._zygote = subprocess.Popen(
            [sys.executable, "-c", f"from tests.ray_zygote import serve; serve({path!r})"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent,  # the session's main thread outlives it
        )
        assert self._zygote.stdout is not None
        if self._zygote.stdout.readline().strip() == "ready":
            os.environ[ray_zygote.SOCKET_ENV_VAR] = path
        # else: no zygote, and the shim lets Ray start its workers as usual

    def start(self, num_nodes: int = 1, system_config: dict[str, Any] | None = None) -> Any:
        """Replace the current cluster by a new one of ``num_nodes`` nodes; return it (``ray.cluster_utils.Cluster``)."""
        import ray
        from ray.cluster_utils import Cluster

        if os.environ.get(WITHOUT_RAY):
            raise RuntimeError(
                f"{WITHOUT_RAY} is set: this run leaves the tests on Ray to another job "
                "(make test: pytest -k ray); name a test that needs Ray so that -k ray selects it"
            )
        self.suspend()
        self._start_zygote()
        if self._temp_dir is None:  # short: Ray's socket paths must fit in 107 characters
            self._temp_dir = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ar-")
        head = {**NODE_OPTIONS, "include_dashboard": False}
        if system_config:
            head["_system_config"] = system_config
        self._cluster = cluster = Cluster(initialize_head=True, connect=False, head_node_args=head)
        for _ in range(num_nodes - 1):
            cluster.add_node(**NODE_OPTIONS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, **DRIVER_OPTIONS)
        return cluster

    @property
    def address(self) -> str:
        """The current cluster's address (``RAY_ADDRESS`` for a driver in another process)."""
        assert self._cluster is not None, "no cluster is running"
        return self._cluster.address

    def ensure(self) -> None:
        """The shared one-node cluster runs and this process is connected to it."""
        import ray

        if self._cluster is None or not ray.is_initialized():
            self.start(1)

    def suspend(self) -> None:
        """Shut the current cluster down (if any); the next :meth:`ensure` starts a new one."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def expect_exit(self, pids: list[int], within: float) -> None:
        """Check at the end of the session that ``pids`` exited ``within`` seconds from now
        (for processes that take their time, without making a test wait for them)."""
        self._expected_exits.append((pids, time.monotonic() + within))

    def close(self) -> None:
        lingering = []
        for pids, deadline in self._expected_exits:
            procs = []
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    procs.append(psutil.Process(pid))
            _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
            lingering += [p.pid for p in alive]
        self._expected_exits = []
        self.suspend()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
            os.environ.pop("RAY_TMPDIR", None)
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote.wait()
            if self._zygote.stdout is not None:
                self._zygote.stdout.close()
            self._zygote = None
        if self._zygote_dir is not None:
            shutil.rmtree(self._zygote_dir, ignore_errors=True)
            self._zygote_dir = None
        os.environ.pop(ray_zygote.SOCKET_ENV_VAR, None)
        # after the cleanup: a failed check must not leave the zygote or its directory behind
        assert not lingering, f"processes still alive past their deadline: {lingering}"


def actors_left(wait: float = 0.0) -> list[str]:
    """Names of the actors of ours that Ray still counts as alive (none if Ray is not running),
    after waiting up to ``wait`` seconds for them to be gone (Ray ends the actors of a driver
    that died a moment after its death)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    deadline = time.monotonic() + wait
    while True:
        named = ray.util.list_named_actors(all_namespaces=True)
        left = [a["name"] for a in named if a["name"].startswith(ACTOR_PREFIX)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


LOCAL_RAY = LocalRay()

"""This process's connection to Ray: made by the first pool of the ray executor that needs
one, shared by the pools, and closed by the last to leave.

If this process is not connected to Ray yet, the first pool connects (to ``address``, else
to ``RAY_ADDRESS``, else to a local Ray instance it starts) and the last pool to close
disconnects, which shuts the local instance down; a connection that was there before is
left as it was. Ray itself is imported only when a ray executor is built.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from aenvs._optional import require

__all__ = ["RUNTIME", "RayRuntime", "import_ray", "init_options"]


def import_ray() -> Any:
    """The ``ray`` module, or a ModuleNotFoundError that says how to install it.

    Example:
        >>> import_ray().__name__
        'ray'
    """
    return require("ray", extra="ray", feature="the ray executor")


class RayRuntime:
    """This process's connection to Ray, when aenvs made it: shared by pools, shut down by the last.

    ``ray.init`` runs on a thread of its own that lives until ``ray.shutdown``: Ray ties the
    processes of a local instance to the thread that started them (they die with it).

    Example:
        >>> runtime = RayRuntime()  # the process has one: RUNTIME
        >>> runtime.release().is_set()  # nobody joined: nothing to shut down
        True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._ready: concurrent.futures.Future[None] | None = None
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    def acquire(self, ray: Any, options: Mapping[str, Any]) -> tuple[bool, Any]:
        """Join the connection aenvs made, or make one (``ray.init(**options)``) if Ray is not initialized.

        Returns (whether this call counts as a user to :meth:`release`, a future of the connection).
        Blocks only while a previous connection of ours finishes shutting down.
        """
        with self._lock:
            stopping = self._stopped if self._stop.is_set() else None
        if stopping is not None:
            stopping.wait(timeout=30)
        with self._lock:
            if self._users:
                self._users += 1
                return True, self._ready
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            if ray.is_initialized():  # someone else's: used as it is, never shut down by us
                done.set_result(None)
                return False, done
            self._users = 1
            self._ready = done
            self._stop = threading.Event()
            self._stopped = threading.Event()
            thread = threading.Thread(
                target=self._keep,
                args=(ray, dict(options), done, self._stop, self._stopped),
                name="aenvs-ray-init",
                daemon=True,
            )
            thread.start()
            return True, done

    def release(self) -> threading.Event | None:
        """One user less; the last one shuts Ray down and gets an event set once that is done."""
        with self._lock:
            self._users = max(self._users - 1, 0)
            if self._users:
                return None
            self._stop.set()
            return self._stopped

    def _keep(
        self,
        ray: Any,
        options: dict[str, Any],
        ready: concurrent.futures.Future[None],
        stop: threading.Event,
        stopped: threading.Event,
    ) -> None:
        temp_dir = None
        try:
            if options.get("address") == "local" and "_temp_dir" not in options:
                # a directory of its own, removed at shutdown: sessions do not pile up in /tmp/ray
                # (in RAY_TMPDIR if set; a short name: Ray's socket paths must stay short)
                temp_dir = tempfile.mkdtemp(prefix="aenvs-", dir=os.environ.get("RAY_TMPDIR"))
                options["_temp_dir"] = temp_dir
            try:
                ray.init(**options)
            except BaseException as exc:
                with self._lock:
                    self._users = 0
                ready.set_exception(exc)
                return
            ready.set_result(None)
            stop.wait()
            with contextlib.suppress(Exception):
                ray.shutdown()
        finally:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
            stopped.set()


RUNTIME = RayRuntime()
"""The one connection of this process that aenvs made, if any."""


def init_options(address: str | None, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``ray.init`` options of an executor given ``address`` and ``init_options``: without
    either, the cluster ``RAY_ADDRESS`` names, else a new local instance (never a cluster found
    running) with every CPU and no dashboard.

    Example:
        >>> init_options("ray://head:10001", {"namespace": "rl"})
        {'namespace': 'rl', 'address': 'ray://head:10001'}
    """
    if options:
        chosen = dict(options)
    elif address is not None or os.environ.get("RAY_ADDRESS"):
        chosen = {}
    else:
        chosen = {"address": "local", "num_cpus": os.cpu_count() or 1, "include_dashboard": False}
    if address is not None:
        chosen["address"] = address
    return chosen

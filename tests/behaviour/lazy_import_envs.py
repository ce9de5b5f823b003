"""Envs whose library imports a submodule lazily, the first time an env uses it.

pygame's ``surfarray`` is such a submodule (``importlib.util.LazyLoader``): the first
attribute read runs the module, and on CPython before 3.12.3 a second thread reading an
attribute meanwhile finds the module object without it ("module 'pygame.surfarray' has no
attribute 'pixels3d'": PettingZoo's pistonball on the thread executor). The package
written here does the same with a submodule that, as it runs, waits (up to a second) for
another thread to reach it before defining its attribute: unguarded, a second env using the
package at the same time fails every time.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym

__all__ = ["LazyImportEnv", "make_lazy_import_env", "write_lazy_package"]

STAGES = ("make", "reset", "step")


def write_lazy_package(root: Path, name: str) -> None:
    """Write the package ``name`` under ``root``: its submodule ``arrays`` is loaded lazily."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent("""
            import importlib.util
            import sys
            import threading

            arrivals = []  # the threads that came to use the submodule
            arrived = threading.Condition()

            def arrive():
                with arrived:
                    arrivals.append(threading.get_ident())
                    arrived.notify_all()

            def _lazy(name):
                spec = importlib.util.find_spec(name)
                loader = importlib.util.LazyLoader(spec.loader)
                spec.loader = loader
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                loader.exec_module(module)
                return module

            arrays = _lazy(__name__ + ".arrays")
        """)
    )
    (package / "arrays.py").write_text(
        textwrap.dedent("""
            import sys
            import threading

            package = sys.modules[__name__.rpartition(".")[0]]
            me = threading.get_ident()
            with package.arrived:  # a slow import: another thread may come meanwhile
                package.arrived.wait_for(lambda: any(t != me for t in package.arrivals), timeout=1.0)

            def pixels():
                return 1
        """)
    )


def _use(package: str) -> None:
    module: Any = sys.modules[package]
    module.arrive()
    assert module.arrays.pixels() == 1


class LazyImportEnv(gym.Env[Any, Any]):
    """Uses the lazily loaded submodule of ``package`` at its build, resets or steps (``stage``)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, package: str, stage: str) -> None:
        assert stage in STAGES
        self.package, self.stage = package, stage
        if stage == "make":
            _use(package)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        if self.stage == "reset":
            _use(self.package)
        return 0, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        if self.stage == "step":
            _use(self.package)
        return 0, 1.0, False, False, {}


def make_lazy_import_env(root: str, package: str, stage: str) -> LazyImportEnv:
    """The env factory: imports ``package`` from ``root`` (in whichever process builds it)."""
    if root not in sys.path:
        sys.path.insert(0, root)
    importlib.import_module(package)
    return LazyImportEnv(package, stage)

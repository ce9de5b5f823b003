"""Envs built from several threads at once: imports do not race, slow constructors overlap.

CPython 3.11 can hand a thread a partially initialized module when two threads import
sibling submodules of a package whose ``__init__`` imports them ("cannot import name
'PendulumEnv' from partially initialized module"): the thread executor building
CartPole-v1, Pendulum-v1, Acrobot-v1, MountainCar-v0 and MountainCarContinuous-v0 in a
fresh interpreter failed so in 7 of 10 runs here. The reproducers below use packages of
their own, shaped like ``gymnasium.envs.classic_control`` (an ``__init__`` importing its
env modules, each importing a sibling through the package), fresh for every attempt, on
which unguarded builds fail every time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch

from aenvs._adapters import build_env, building as aenvs_building
from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind
from aenvs._env import EnvContext
from aenvs._runner import EnvRunner
from tests.behaviour.context_envs import FACTORIES
from tests.behaviour.lazy_import_envs import STAGES, make_lazy_import_env, write_lazy_package
from tests.conftest import PoolFactory

ROOT = Path(__file__).resolve().parents[2]
MODULES = 4  # env modules per package, built by as many threads at once


def write_packages(root: Path, prefix: str, count: int) -> list[str]:
    """``count`` fresh packages named ``{prefix}{k}``, each with env modules ``m0``.. that the
    package's ``__init__`` imports (after a short pause, which makes the race certain)."""
    names = []
    for k in range(count):
        name = f"{prefix}{k}"
        package = root / name
        package.mkdir()
        (package / "util.py").write_text("")
        imports = "".join(f"from {name}.m{m} import Env as Env{m}\n" for m in range(MODULES))
        (package / "__init__.py").write_text(f"import time\ntime.sleep(0.01)\n{imports}")
        for m in range(MODULES):
            (package / f"m{m}.py").write_text(
                textwrap.dedent(f"""
                    import gymnasium as gym
                    from {name} import util  # through the package, as classic_control's envs do

                    class Env(gym.Env):
                        observation_space = gym.spaces.Discrete(2)
                        action_space = gym.spaces.Discrete(2)

                        def reset(self, *, seed=None, options=None):
                            return 0, {{}}
                """)
            )
        names.append(name)
    return names


def run_fresh(code: str, *args: str, timeout: float = 120) -> Any:
    """Run ``code`` in a fresh interpreter (nothing imported yet); the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *args[:1]])}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


BUILD_FROM_THREADS = """
import functools, importlib, json, sys, threading
import gymnasium as gym
from aenvs._env import EnvContext
from aenvs._adapters import build_env

def closure(env_id):  # CleanRL's make_env: a thunk closing over the id
    def thunk():
        return gym.make(env_id)
    return thunk

def importer(module):
    def thunk():
        return importlib.import_module(module).Env()
    return thunk

NAMINGS = {
    "id": lambda env_id, module: env_id,
    "partial": lambda env_id, module: functools.partial(gym.make, env_id),
    "closure": lambda env_id, module: closure(env_id),
    "importer": lambda env_id, module: importer(module),
}
failures = {}
for naming, packages in zip(NAMINGS, sys.argv[2:]):
    failures[naming] = []
    for package in packages.split(","):
        fns = []
        for m in range(MODULES):
            gym.register(f"{package}/M{m}-v0", entry_point=f"{package}.m{m}:Env")
            fns.append(NAMINGS[naming](f"{package}/M{m}-v0", f"{package}.m{m}"))
        barrier = threading.Barrier(MODULES)

        def build(m):
            barrier.wait()
            try:
                build_env(fns[m], EnvContext(m, m, MODULES))
            except Exception as exc:
                failures[naming].append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=build, args=(m,)) for m in range(MODULES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
print(json.dumps(failures))
""".replace("MODULES", str(MODULES))


def test_first_builds_from_threads_do_not_race_on_imports(tmp_path: Path) -> None:
    """Threads building envs of fresh modules at once, named every way a factory can be."""
    namings = ["id", "partial", "closure", "importer"]
    packages = [",".join(write_packages(tmp_path, f"{naming}_pkg", 5)) for naming in namings]
    failures = run_fresh(BUILD_FROM_THREADS, str(tmp_path), *packages)
    assert list(failures) == namings
    assert failures == {naming: [] for naming in namings}


THREAD_POOL = """
import asyncio, json, sys
from aenvs import AsyncEnvPool
import gymnasium as gym

CLASSIC = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]

async def main():
    failures = []
    pools = [CLASSIC]
    for package in sys.argv[2].split(","):
        ids = [f"{package}/M{m}-v0" for m in range(MODULES)]
        for m, env_id in enumerate(ids):
            gym.register(env_id, entry_point=f"{package}.m{m}:Env")
        pools.append(ids)
    for env_fns in pools:
        try:
            async with AsyncEnvPool(env_fns, executor="thread", envs_per_worker=1) as pool:
                await pool.reset()
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
    print(json.dumps({"pools": len(pools), "failures": failures}))

asyncio.run(main())
""".replace("MODULES", str(MODULES))


def test_a_thread_pool_of_envs_from_fresh_modules_starts(tmp_path: Path) -> None:
    """The thread executor (the one building envs of a pool on several threads) in a fresh
    interpreter: the five classic-control envs, then pools over fresh packages."""
    packages = write_packages(tmp_path, "pool_pkg", 4)
    result = run_fresh(THREAD_POOL, str(tmp_path), ",".join(packages))
    assert result == {"pools": 5, "failures": []}


def test_later_builds_of_a_kind_overlap() -> None:
    """Only the first build of a kind is serialized: the others may be slow (a connection
    to a remote simulator) and still start at the same time."""
    n = 4
    together = threading.Barrier(n - 1, timeout=10)

    class SlowEnv(gym.Env):
        observation_space = gym.spaces.Discrete(2)
        action_space = gym.spaces.Discrete(2)
        built = 0

        def __init__(self) -> None:
            first = SlowEnv.built == 0
            SlowEnv.built += 1
            if not first:
                together.wait()  # BrokenBarrierError unless the n - 1 later builds overlap

    errors: list[BaseException] = []

    def build(i: int) -> None:
        try:
            build_env(SlowEnv, EnvContext(i, i, n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and SlowEnv.built == n


def test_later_resets_and_steps_of_a_kind_overlap() -> None:
    """Only the first reset and the first step of a kind run alone (they may still import
    modules): the later ones run at the same time, and then take the array path."""
    n = 4
    together = threading.Barrier(n - 1, timeout=10)
    arrived = threading.Condition()
    arrivals = {CommandKind.RESET: 0, CommandKind.STEP: 0}  # the runners about to run each
    between = threading.Barrier(n, timeout=30)

    class SlowEnv(gym.Env[Any, Any]):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
        action_space = gym.spaces.Discrete(2)
        first: ClassVar[dict[CommandKind, bool]] = {CommandKind.RESET: True, CommandKind.STEP: True}

        def meet(self, stage: CommandKind) -> np.ndarray:
            with arrived:
                first, SlowEnv.first[stage] = SlowEnv.first[stage], False
                if first:  # the first one ends once the others wait for it
                    arrived.wait_for(lambda: arrivals[stage] == n, timeout=10)
            if not first:
                together.wait()  # BrokenBarrierError unless the n - 1 later ones overlap
            return np.zeros(2, np.float32)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            return self.meet(CommandKind.RESET), {}

        def step(self, action: Any) -> Any:
            return self.meet(CommandKind.STEP), 0.0, False, False, {}

    runners = [EnvRunner.build({0: SlowEnv}, num_envs=1) for _ in range(n)]
    errors: list[Any] = []

    def run(runner: EnvRunner) -> None:
        runner.attach({0: Buffers.allocate([runner.specs[0]]).rows(0)})
        for kind in (CommandKind.RESET, CommandKind.STEP):
            between.wait()  # every env resets, then every env steps (as a pool's batches do)
            with arrived:
                arrivals[kind] += 1
                arrived.notify_all()
            errors.extend(c.error for c in runner.run_plain(Command(kind, [0])) if c.error is not None)

    threads = [threading.Thread(target=run, args=(r,)) for r in runners]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        assert all(r._slots[0].env_step is not None for r in runners)  # pyright: ignore[reportPrivateUsage]
    finally:
        for r in runners:
            r.close()


def test_a_factory_building_envs_on_other_threads_does_not_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first build holds the build lock; a factory that waits for envs built on other
    threads (a nested pool) gets them once the bounded wait for the lock is over."""
    monkeypatch.setattr(aenvs_building, "_BUILD_LOCK_WAIT", 0.2)

    class Inner(gym.Env):
        observation_space = gym.spaces.Discrete(2)
        action_space = gym.spaces.Discrete(2)

    class Outer(Inner):
        def __init__(self) -> None:
            built: list[Any] = []
            worker = threading.Thread(target=lambda: built.append(build_env(Inner, EnvContext(0, 0, 1))))
            worker.start()
            worker.join(timeout=10)
            assert built, "the env built on another thread never came"

    started = time.monotonic()
    assert isinstance(build_env(Outer, EnvContext(0, 0, 1)), Outer)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("stage", STAGES)
async def test_envs_first_using_a_lazily_imported_module_at_once(
    make_pool: PoolFactory, executor: str, tmp_path: Path, stage: str
) -> None:
    """Envs whose library loads a submodule lazily on first use (pygame's ``surfarray``:
    pistonball) at their build, first reset or first step, several at once: none of them
    finds the submodule half-run. The thread executor runs each env on a thread of its own,
    Ray's actors each of their plain envs."""
    name = f"lazy_{stage}_{tmp_path.name}".replace("-", "_")  # a fresh package in this process
    write_lazy_package(tmp_path, name)
    fn = functools.partial(make_lazy_import_env, str(tmp_path), name, stage)
    options = {"envs_per_worker": 4} if executor == "ray" else {}  # one actor, four threads
    pool = await make_pool([fn] * 4, **options)
    td = await pool.reset()
    td["action"] = torch.zeros(4, dtype=torch.int64)
    out = await pool.step(td)
    assert out["next", "reward"].flatten().tolist() == [1.0] * 4


async def test_factories_get_an_env_context_when_they_ask_for_one(make_pool: PoolFactory) -> None:
    """A parameter annotated EnvContext, one named ctx or context (a default or not), or one
    positional parameter with no default: the factory gets its env's EnvContext. Otherwise
    (a default of its own, gymnasium.make with an id bound) it is called with no argument."""
    names = list(FACTORIES)
    pool = await make_pool([FACTORIES[name][0] for name in names])
    got = dict(zip(names, await pool.get_attr("got"), strict=True))
    assert got == {name: (i if FACTORIES[name][1] else None) for i, name in enumerate(names)}
    assert (await pool.get_attr("seed_given", env_index=[names.index("other_optional")])) == [7]

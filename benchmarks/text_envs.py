"""Text envs: observations of 200-2,000 characters, text actions, on every executor.

An echo-style env (the observation is a string of 200-2,000 characters, the action a
short string; the step itself does almost nothing), in one run:

- ``text``: aenvs on each executor at several N, lockstep (send all, receive all) and
  overlapped (receive whichever envs are ready, send them straight back), against
  gymnasium's ``AsyncVectorEnv(shared_memory=False)`` (one process per env) and a plain
  ``ThreadPoolExecutor`` loop over the same envs (lockstep);
- ``carry``: what carrying text costs a pool (inline, lockstep): the same env with a
  fixed-shape observation only (a ``Box``; and a ``Dict`` of it and an int), a mixed one
  (the ``Box`` plus a text field, as a ``Dict``) and a text one; the ratio is each pool's
  CPU per step over the ``Box``-only pool's;
- ``async``: N = 4,096 coroutine envs (``async def step``, inline executor) whose
  observation is a 500-2,000-character text, against the same envs with an int observation
  in its place, and a plain asyncio loop (``asyncio.gather`` of the envs' steps, no pool)
  over the text envs; the ratio is the text pool's CPU per step over the int pool's. Then
  the same three after ``gc.freeze()``.

Reported per row: env steps/s and CPU per env step of the thread that drives the pool or
the vector env (``time.thread_time``: the pool's own cost where the envs run elsewhere,
the envs' too where they run on that thread, as inline), the median of ``--repeats``
windows after a warm-up. Results go to ``benchmarks/results/text_envs.json``.

Run:
    python benchmarks/text_envs.py --num-envs 8 64 512 --steps 4000 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import tensordict
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

import aenvs
from aenvs import Env
from aenvs._tensors import non_tensor_stack

CHARSET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"
ACTIONS = ("look", "go north", "take lamp", "open door")
PAGES = tuple("".join(CHARSET[(i * 7 + k) % len(CHARSET)] for k in range(2000)) for i in range(8))
ASYNC_N = 4096
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "text_envs.json")


@dataclass
class Row:
    workload: str
    system: str
    n: int
    steps_per_s: float
    cpu_us_per_step: float
    ratio: float | None = None  # carry / async rows: CPU per step over the reference row's


class EchoText(gym.Env[Any, str]):
    """Observation: a page of 200-2,000 characters that echoes the action; never ends.

    ``text=False``: a fixed-shape observation (4 floats) instead; ``mixed``: both, as a Dict
    (with ``text=False``: the page's length in the text's place, a fixed-shape Dict).
    """

    def __init__(self, mixed: bool = False, text: bool = True) -> None:
        self.text, self.mixed = text, mixed
        page = spaces.Text(2000, min_length=0, charset=CHARSET) if text else spaces.Discrete(2001)
        pos = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.observation_space: spaces.Space[Any] = (
            spaces.Dict({"page": page, "pos": pos}) if mixed else page if text else pos
        )
        self.action_space = spaces.Text(16, charset=CHARSET)
        self._t = 0

    def _obs(self, action: str) -> Any:
        self._t += 1
        length = 200 + (self._t * 397) % 1801
        page = (action + " " + PAGES[self._t % 8])[:length]
        pos = np.full(4, (self._t % 100) / 100, np.float32)
        if self.mixed:
            return {"page": page if self.text else len(page), "pos": pos}
        return page if self.text else pos

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs("start"), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._obs(str(action)), 1.0, False, False, {}


class AsyncTextEnv(Env):
    """A coroutine env (it awaits once a step, as one waiting on a service would) whose
    observation is a text of 500-2,000 characters; the action picks nothing."""

    observation_space: spaces.Space[Any] = spaces.Text(2000, min_length=0, charset=CHARSET)
    action_space = spaces.Discrete(4)

    def __init__(self) -> None:
        self._t = 0

    def _obs(self) -> Any:
        self._t += 1
        return PAGES[self._t % 8][: 500 + (self._t * 397) % 1501]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"observation": self._obs()}

    async def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        await asyncio.sleep(0)
        return {"observation": self._obs(), "reward": 1.0, "terminated": False}


class AsyncIntEnv(AsyncTextEnv):
    """The same coroutine env with an int observation in the text's place."""

    observation_space = spaces.Discrete(1 << 30)

    def _obs(self) -> Any:
        self._t += 1
        return 500 + (self._t * 397) % 1501


def _text_actions(k: int) -> TensorDict:
    td = TensorDict({}, [k])
    td.set("action", non_tensor_stack([ACTIONS[i % 4] for i in range(k)]))
    return td


def _int_actions(k: int) -> TensorDict:
    return TensorDict({"action": torch.zeros(k, dtype=torch.int64)}, [k])


def _median(windows: list[tuple[float, float]]) -> tuple[float, float]:
    """The median steps/s and CPU us per step of ``(steps/s, us)`` windows."""
    return statistics.median(w[0] for w in windows), statistics.median(w[1] for w in windows)


def _timed(run: Callable[[], int], repeats: int) -> tuple[float, float]:
    """Median steps/s and this thread's CPU us per step over ``repeats`` runs of ``run``
    (which returns the steps it took), after one run of warm-up."""
    run()
    windows: list[tuple[float, float]] = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        steps = run()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        windows.append((steps / wall, cpu / steps * 1e6))
    return _median(windows)


async def _atimed(run: Callable[[], Awaitable[int]], repeats: int) -> tuple[float, float]:
    """:func:`_timed` for a coroutine, on the running loop's thread."""
    await run()
    windows: list[tuple[float, float]] = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        steps = await run()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        windows.append((steps / wall, cpu / steps * 1e6))
    return _median(windows)


def measure_aenvs(
    executor: str,
    n: int,
    steps: int,
    repeats: int,
    overlapped: bool,
    env_fn: Callable[[], Any] | None = None,
    actions: Callable[[int], TensorDict] = _text_actions,
) -> tuple[float, float]:
    """A pool of ``n`` envs of ``env_fn`` (default: text ``EchoText``) on ``executor``."""

    async def main() -> tuple[float, float]:
        async with aenvs.AsyncEnvPool([env_fn or EchoText] * n, executor=executor) as pool:
            await pool.reset()
            rounds = max(2, steps // n)

            async def lockstep() -> int:
                for _ in range(rounds):
                    await pool.step(actions(n))
                return rounds * n

            async def overlap() -> int:
                await pool.async_step_send(actions(n))
                done = 0
                while done < rounds * n:
                    out = await pool.async_step_recv(min_get=1)
                    done += out.batch_size[0]
                    await pool.async_step_send(actions(out.batch_size[0]), env_index=out["env_index"])
                await pool.async_step_recv(min_get=n)  # the last round in flight
                return done

            return await _atimed(overlap if overlapped else lockstep, repeats)

    return asyncio.run(main())


def measure_plain_asyncio(n: int, steps: int, repeats: int) -> tuple[float, float]:
    """The floor for coroutine envs: ``asyncio.gather`` of ``n`` envs' steps, no pool."""

    async def main() -> tuple[float, float]:
        envs = [AsyncTextEnv() for _ in range(n)]
        for env in envs:
            env.reset()
        td = TensorDict({"action": torch.tensor(0)}, [])
        rounds = max(2, steps // n)

        async def run() -> int:
            for _ in range(rounds):
                await asyncio.gather(*(env.step(td) for env in envs))
            return rounds * n

        return await _atimed(run, repeats)

    return asyncio.run(main())


def measure_gymnasium_async(n: int, steps: int, repeats: int) -> tuple[float, float]:
    envs = gym.vector.AsyncVectorEnv([EchoText] * n, shared_memory=False)
    try:
        envs.reset(seed=0)
        actions = tuple(ACTIONS[i % 4] for i in range(n))
        rounds = max(2, steps // n)

        def run() -> int:
            for _ in range(rounds):
                envs.step(actions)
            return rounds * n

        return _timed(run, repeats)
    finally:
        envs.close()


def measure_thread_pool(n: int, steps: int, repeats: int) -> tuple[float, float]:
    envs = [EchoText() for _ in range(n)]
    for env in envs:
        env.reset(seed=0)
    rounds = max(2, steps // n)
    with concurrent.futures.ThreadPoolExecutor(min(n, 64)) as pool:

        def run() -> int:
            for _ in range(rounds):
                list(pool.map(lambda i: envs[i].step(ACTIONS[i % 4]), range(n)))
            return rounds * n

        return _timed(run, repeats)


def measure(
    num_envs: Sequence[int] = (8, 64, 512),
    steps: int = 4000,
    repeats: int = 5,
    executors: Sequence[str] = ("inline", "thread", "process"),
    gymnasium_max_n: int = 512,
    carry_n: int = 64,
    async_n: int = ASYNC_N,
    sections: Sequence[str] = ("text", "carry", "async"),
) -> list[Row]:
    """Every row of the benchmark (``sections`` of ``text``, ``carry``, ``async``)."""
    rows: list[Row] = []

    def add(
        workload: str, system: str, n: int, result: tuple[float, float], ratio: float | None = None
    ) -> Row:
        row = Row(workload, system, n, *result, ratio)
        rows.append(row)
        extra = "" if ratio is None else f"  {ratio:.2f}x"
        print(
            f"{workload:5s} {system:34s} N={n:5d} {result[0]:10,.0f} steps/s "
            f"{result[1]:8.1f} us CPU/step{extra}",
            flush=True,
        )
        return row

    torch.set_num_threads(1)
    if "text" in sections:
        for n in num_envs:
            for executor in executors:
                for overlapped in (False, True):
                    mode = "overlapped" if overlapped else "lockstep"
                    result = measure_aenvs(executor, n, steps, repeats, overlapped)
                    add("text", f"aenvs {executor} {mode}", n, result)
            add("text", "ThreadPoolExecutor loop", n, measure_thread_pool(n, steps, repeats))
            if n <= gymnasium_max_n:
                add(
                    "text", "gymnasium AsyncVectorEnv (no shm)", n, measure_gymnasium_async(n, steps, repeats)
                )
    if "carry" in sections:
        fixed = add(
            "carry",
            "aenvs inline lockstep, fixed obs",
            carry_n,
            measure_aenvs("inline", carry_n, steps, repeats, False, lambda: EchoText(text=False)),
        )
        fixed_dict = add(
            "carry",
            "aenvs inline lockstep, fixed Dict obs",
            carry_n,
            measure_aenvs("inline", carry_n, steps, repeats, False, lambda: EchoText(mixed=True, text=False)),
            None,
        )
        fixed_dict.ratio = fixed_dict.cpu_us_per_step / fixed.cpu_us_per_step
        mixed = measure_aenvs("inline", carry_n, steps, repeats, False, lambda: EchoText(mixed=True))
        add("carry", "aenvs inline lockstep, mixed obs", carry_n, mixed, mixed[1] / fixed.cpu_us_per_step)
        print(f"      (mixed over the fixed Dict: {mixed[1] / fixed_dict.cpu_us_per_step:.2f}x)", flush=True)
        text = measure_aenvs("inline", carry_n, steps, repeats, False, EchoText)
        add("carry", "aenvs inline lockstep, text obs", carry_n, text, text[1] / fixed.cpu_us_per_step)
    if "async" in sections:
        big = max(steps, 4 * async_n)  # a few rounds of every env a window
        for frozen in (False, True):
            # gc.freeze(): the collector's full passes skip what exists by then (torch's
            # ~300k objects), as a long-running trainer can ask; the rows' own objects remain
            if frozen:
                gc.collect()
                gc.freeze()
            tail = ", gc.freeze()" if frozen else ""
            ints = add(
                "async",
                f"aenvs inline lockstep, int obs{tail}",
                async_n,
                measure_aenvs("inline", async_n, big, repeats, False, AsyncIntEnv, _int_actions),
            )
            text = measure_aenvs("inline", async_n, big, repeats, False, AsyncTextEnv, _int_actions)
            add(
                "async",
                f"aenvs inline lockstep, text obs{tail}",
                async_n,
                text,
                text[1] / ints.cpu_us_per_step,
            )
            plain = measure_plain_asyncio(async_n, big, repeats)
            add(
                "async",
                f"plain asyncio loop, text obs{tail}",
                async_n,
                plain,
                plain[1] / ints.cpu_us_per_step,
            )
        gc.unfreeze()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--steps", type=int, default=4000, help="env steps per measured window")
    parser.add_argument("--repeats", type=int, default=5, help="measured windows per row (median)")
    parser.add_argument("--executors", nargs="+", default=["inline", "thread", "process"])
    parser.add_argument("--gymnasium-max-n", type=int, default=512, help="largest N for AsyncVectorEnv")
    parser.add_argument("--async-n", type=int, default=ASYNC_N, help="N of the coroutine-env rows")
    parser.add_argument("--sections", nargs="+", default=["text", "carry", "async"])
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args()
    rows = measure(
        args.num_envs,
        args.steps,
        args.repeats,
        args.executors,
        args.gymnasium_max_n,
        async_n=args.async_n,
        sections=args.sections,
    )
    setup = {
        "command": " ".join(["python", *sys.argv]),
        "steps": args.steps,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "aenvs": aenvs.__version__,
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "gymnasium": gym.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({**setup, "rows": [asdict(r) for r in rows]}, f, indent=2)
        f.write("\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

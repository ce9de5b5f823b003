"""The ``aenvs`` command line.

Subcommands:

``aenvs run [ENV_ID]``
    Step a pool of gymnasium envs with random actions and report throughput and
    episode returns.
``aenvs bench``
    Run the benchmark suite against the peers installed and write a markdown report with
    PNG plots. The suite lives beside the package, in a checkout of the repository
    (``benchmarks/``), not in the wheel: this command finds that checkout and runs it.

Each subcommand is one ``_add_<name>_parser`` function registered in
:data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib
import math
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
from gymnasium import spaces

import aenvs
from aenvs._specs import EnvSpec, Space, flatten_value

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDictBase

    from aenvs._pool import AsyncEnvPool

__all__ = ["RandomActions", "RunSummary", "build_parser", "main"]

T = TypeVar("T")

EXECUTORS = ("inline", "thread", "process")
STACK_MODES = ("auto", "dense", "lazy")
LOOPS = ("auto", "uvloop", "asyncio")


# -- event loop ------------------------------------------------------------------------


def run_coroutine(coro: Coroutine[Any, Any, T], loop: str = "auto") -> T:
    """Run ``coro`` to completion on uvloop when importable (``loop="auto"``), else on asyncio."""
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                coro.close()
                raise
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
    return asyncio.run(coro)


# -- random actions --------------------------------------------------------------------


class RandomActions:
    """Samples actions for some envs of a pool, each from its own action space.

    On a dense pool, Discrete and finite float Box spaces are sampled with one torch
    call per group of envs sharing a space; other spaces (and every lazy pool) fall
    back to ``space.sample()`` per env, stacked densely or lazily as the pool stacks.

    Args:
        specs: one per env (``pool.env_specs``).
        dense: whether the pool stacks densely (``pool.is_dense``).
        seed: seeds the torch generator and the (copied) action spaces.

    Example:
        >>> sampler = RandomActions(pool.env_specs, dense=pool.is_dense, seed=0)
        >>> td = sampler.fill(td)  # td["action"] is set for the envs of td["env_index"]
    """

    def __init__(self, specs: Sequence[EnvSpec], *, dense: bool, seed: int | None = None) -> None:
        import torch

        self._specs = list(specs)
        self._dense = dense
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        # copies: the specs may hold the envs' own space objects, which we must not reseed
        self._spaces = [copy.deepcopy(s.action_space) for s in self._specs]
        for i, space in enumerate(self._spaces):
            space.seed(None if seed is None else seed + i)
        self._groups: list[Space] = []
        self._group_of: list[int] = []
        for space in self._spaces:
            for g, known in enumerate(self._groups):
                if type(known) is type(space) and known == space:
                    self._group_of.append(g)
                    break
            else:
                self._groups.append(space)
                self._group_of.append(len(self._groups) - 1)
        self.vectorised = dense and all(_vectorisable(space) for space in self._groups)

    def __call__(self, env_index: torch.Tensor | Sequence[int]) -> TensorDictBase:
        """A batch ``[len(env_index)]`` holding ``"action"`` (and nested action keys) for those envs."""
        import torch
        from tensordict import TensorDict

        from aenvs._tensors import lazy_stack, tensor_tolist

        indices = torch.as_tensor(env_index, dtype=torch.long).reshape(-1)
        if self.vectorised:
            return TensorDict({"action": self._sample_vectorised(indices)}, batch_size=[len(indices)])
        tds = [self._sample_one(i) for i in tensor_tolist(indices)]
        if self._dense:
            return torch.stack(tds)  # pyright: ignore[reportReturnType, reportArgumentType]
        return lazy_stack(tds)

    def fill(self, td: TensorDictBase) -> TensorDictBase:
        """Set random actions into ``td`` for the envs of its ``"env_index"``; return ``td``."""
        if self.vectorised:  # the hot path: one tensor, no intermediate TensorDict
            td.set("action", self._sample_vectorised(td["env_index"]))
        else:
            td.update(self(td["env_index"]))  # pyright: ignore[reportUnknownMemberType]
        return td

    def _sample_vectorised(self, indices: torch.Tensor) -> torch.Tensor:
        import torch

        from aenvs._tensors import tensor_tolist

        if len(self._groups) == 1:
            return self._sample_space(self._groups[0], len(indices))
        groups = torch.as_tensor(self._group_of)[indices]
        first = self._sample_space(self._groups[int(groups[0])], len(indices))
        out = torch.empty_like(first)
        counts: list[int] = tensor_tolist(torch.bincount(groups, minlength=len(self._groups)))
        for g, count in enumerate(counts):
            if count:
                out[groups == g] = self._sample_space(self._groups[g], count)
        return out

    def _sample_space(self, space: Space, k: int) -> torch.Tensor:
        import torch

        from aenvs._tensors import torch_dtype

        if isinstance(space, spaces.Discrete):
            start, n = int(space.start), int(space.n)
            return torch.randint(start, start + n, (k,), generator=self._generator, dtype=torch.long)
        assert isinstance(space, spaces.Box)
        space = cast("spaces.Box[Any]", space)
        dtype = torch_dtype(space.dtype)
        shape = (k, *space.shape)
        low, high = np.asarray(space.low), np.asarray(space.high)
        lo, hi = float(low.min()), float(high.max())
        if (low == lo).all() and (high == hi).all():  # scalar bounds
            return torch.empty(shape, dtype=dtype).uniform_(lo, hi, generator=self._generator)
        low_t = torch.as_tensor(low, dtype=dtype)
        span = torch.as_tensor(high, dtype=dtype) - low_t
        return low_t + span * torch.rand(shape, dtype=dtype, generator=self._generator)

    def _sample_one(self, i: int) -> TensorDictBase:
        import torch
        from tensordict import TensorDict

        from aenvs._tensors import torch_dtype

        space, spec = self._spaces[i], self._specs[i]
        dtypes = {leaf.key: torch_dtype(leaf.dtype) for leaf in spec.action_leaves if not leaf.is_object}
        objects = {leaf.key for leaf in spec.action_leaves if leaf.is_object}
        td = TensorDict({}, batch_size=[])
        for key, value in flatten_value(space, space.sample(), spec.action_root):
            if key in dtypes:
                td.set(key, torch.as_tensor(np.asarray(value), dtype=dtypes[key]))
            elif key in objects:  # text, token lists...: as sampled
                td.set_non_tensor(key, value)
        return td


def _vectorisable(space: Space) -> bool:
    if isinstance(space, spaces.Discrete):
        return True
    if not isinstance(space, spaces.Box):
        return False
    space = cast("spaces.Box[Any]", space)
    if not np.issubdtype(space.dtype, np.floating):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(space.high - space.low).all())  # finite bounds and a finite span


# -- aenvs run -------------------------------------------------------------------------


@dataclass
class RunSummary:
    """What ``aenvs run`` measured."""

    steps: int
    seconds: float
    episodes: int
    mean_return: float
    mean_length: float
    mean_step_latency: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else math.inf

    def lines(self) -> list[str]:
        mean_return = f"{self.mean_return:.2f}" if self.episodes else "n/a (no episode finished)"
        mean_length = f"{self.mean_length:.1f}" if self.episodes else "n/a"
        return [
            f"steps:               {self.steps} in {self.seconds:.2f} s",
            f"steps/s:             {self.steps_per_second:,.0f}",
            f"episodes finished:   {self.episodes}",
            f"mean episode return: {mean_return}",
            f"mean episode length: {mean_length}",
            f"mean step latency:   {self.mean_step_latency * 1e3:.3f} ms",
        ]


async def run_random(
    pool: AsyncEnvPool, steps: int, *, seed: int | None = None, progress: bool = True
) -> RunSummary:
    """Step ``pool`` (started) ``steps`` times in all with random actions, resetting finished envs."""
    from tqdm import tqdm

    sampler = RandomActions(pool.env_specs, dense=pool.is_dense, seed=seed)
    returns = np.zeros(pool.num_envs)  # of the episode running in each env
    lengths = np.zeros(pool.num_envs, dtype=np.int64)
    episodes, return_sum, length_sum = 0, 0.0, 0
    td = await pool.reset()
    done_steps = 0
    started = time.perf_counter()
    with tqdm(total=steps, unit="step", unit_scale=True, disable=not progress, dynamic_ncols=True) as bar:
        while done_steps < steps:
            if steps - done_steps < td.batch_size[0]:  # the last round steps only what is left
                td = td[: steps - done_steps]
            out, td = await pool.step_and_maybe_reset(sampler.fill(td))
            index = out["env_index"].numpy()
            returns[index] += out["next", "reward"].numpy().reshape(-1)
            lengths[index] += 1
            finished = index[out["next", "done"].numpy().reshape(-1)]
            if len(finished):
                episodes += len(finished)
                return_sum += float(returns[finished].sum())
                length_sum += int(lengths[finished].sum())
                returns[finished] = 0.0
                lengths[finished] = 0
            done_steps += len(index)
            bar.update(len(index))
    seconds = time.perf_counter() - started
    stats = pool.stats()
    latencies = [m for m, n in zip(stats.step_latency_mean, stats.steps, strict=True) if n]
    return RunSummary(
        steps=done_steps,
        seconds=seconds,
        episodes=episodes,
        mean_return=return_sum / episodes if episodes else math.nan,
        mean_length=length_sum / episodes if episodes else math.nan,
        mean_step_latency=sum(latencies) / len(latencies) if latencies else 0.0,
    )


async def _run(args: argparse.Namespace) -> int:
    from aenvs._pool import AsyncEnvPool

    pool = AsyncEnvPool(
        args.env_id,
        num_envs=args.num_envs,
        executor=args.executor,
        stack=args.stack,
        seed=args.seed,
        envs_per_worker=args.envs_per_worker,
    )
    async with pool:
        stack = "dense" if pool.is_dense else "lazy"
        print(
            f"aenvs run: {args.env_id} x {args.num_envs} envs, executor={args.executor}, "
            f"stack={stack}, loop={type(asyncio.get_running_loop()).__module__.split('.')[0]}",
            flush=True,
        )
        summary = await run_random(pool, args.steps, seed=args.seed, progress=not args.no_progress)
    print("\n".join(summary.lines()), flush=True)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    return run_coroutine(_run(args), loop=args.loop)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the uninformative ones (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_run_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="step a pool of envs with random actions; report steps/s and episode returns",
        description=(
            "Step NUM_ENVS copies of a gymnasium env with random actions (each env's action "
            "sampled from its own action space), resetting envs whose episode ends, for STEPS "
            "env steps in all. Prints steps/s, the number of finished episodes, their mean "
            "return and length, and the mean step latency."
        ),
        epilog="example: aenvs run CartPole-v1 --num-envs 16 --executor inline --steps 50000",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "env_id",
        metavar="ENV_ID",
        nargs="?",
        default="CartPole-v1",
        help="gymnasium id passed to gymnasium.make ('module:Name-v0' imports module first)",
    )
    parser.add_argument("-n", "--num-envs", type=_positive_int, default=8, help="envs in the pool")
    parser.add_argument(
        "-e",
        "--executor",
        choices=EXECUTORS,
        default="thread",
        help="where the envs run: on the event loop, on worker threads or in worker processes",
    )
    parser.add_argument(
        "--envs-per-worker",
        type=_positive_int,
        default=None,
        help="envs hosted by one worker thread or process (default: the executor's, 1 for threads)",
    )
    parser.add_argument(
        "-s", "--steps", type=_positive_int, default=100_000, help="env steps in all (summed over envs)"
    )
    parser.add_argument(
        "--stack",
        choices=STACK_MODES,
        default="auto",
        help="batch layout: dense TensorDicts, lazy stacks, or dense when every env agrees",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds the envs' first reset and the random actions (default: unseeded)",
    )
    parser.add_argument(
        "--loop", choices=LOOPS, default="auto", help="event loop: uvloop when importable, or force one"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=_cmd_run)


# -- aenvs bench -----------------------------------------------------------------------


def _checkout() -> Path | None:
    """The checkout of aenvs whose ``benchmarks/`` suite ``aenvs bench`` runs: the one this
    aenvs is imported from (an editable install), else the current folder or one above it;
    None outside a checkout (an aenvs installed from a wheel, run elsewhere)."""
    here = Path(aenvs.__file__).resolve().parents[1]
    cwd = Path.cwd().resolve()
    for root in (here, cwd, *cwd.parents):
        suite = root / "benchmarks" / "harness" / "__init__.py"
        if suite.is_file() and (root / "pyproject.toml").is_file():
            return root
    return None


def _cmd_bench(argv: Sequence[str]) -> int:
    """``aenvs bench ARGS``: the checkout's suite parses ``ARGS`` itself (it owns its options)."""
    root = _checkout()
    if root is None:
        print(
            "aenvs bench: the benchmark suite is not part of the aenvs package; run it from a "
            "checkout of the aenvs repository (`make bench` there, or `aenvs bench` with the "
            "checkout installed: pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # imported by name: the library does not depend on the suite, which the wheel does not hold
    harness = importlib.import_module("benchmarks.harness")
    return harness.main(list(argv), prog="aenvs bench")


def _add_bench_parser(subparsers: Any) -> None:
    # listed for `aenvs --help` only: main() hands `aenvs bench ...` to the suite before parsing
    subparsers.add_parser(
        "bench",
        help="run the benchmark suite; write a markdown report with plots (from a checkout)",
        add_help=False,
    )


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_run_parser, _add_bench_parser]


def build_parser() -> argparse.ArgumentParser:
    """The ``aenvs`` argument parser, with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="aenvs",
        description="aenvs: an asyncio-first pool of RL environments.",
        epilog="Run 'aenvs COMMAND --help' for a command's options.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"aenvs {aenvs.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aenvs`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except aenvs.EnvError as exc:  # an env failed (to build, reset or step): its own error, briefly
        print(f"aenvs {args.command}: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

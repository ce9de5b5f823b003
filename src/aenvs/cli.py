"""The ``aenvs`` command line.

Subcommands:

``aenvs run [ENV_ID]``
    Step a pool of gymnasium envs with random actions and report throughput and
    episode returns; a live view (:mod:`aenvs._live`) shows rates, envs in flight and
    latency percentiles as it runs. The pool's limits and deadlines are options.
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
import contextlib
import importlib
import math
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import aenvs
from aenvs._optional import MissingExtraError
from aenvs._random_actions import RandomActions
from aenvs._rate_limit import RateLimit

if TYPE_CHECKING:
    from aenvs._live import LiveView
    from aenvs._pool import AsyncEnvPool

__all__ = ["RandomActions", "RunSummary", "build_parser", "main"]

T = TypeVar("T")

EXECUTORS = ("inline", "thread", "process", "ray")
STACK_MODES = ("auto", "dense", "lazy")
LOOPS = ("auto", "uvloop", "asyncio")
REPOSITORY = "https://github.com/aenvs/aenvs"  # where `aenvs bench` sends users for the suite


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
    pool: AsyncEnvPool,
    steps: int,
    *,
    seed: int | None = None,
    progress: bool = True,
    view: LiveView | None = None,
) -> RunSummary:
    """Step ``pool`` (started) ``steps`` times in all with random actions, resetting finished envs.

    ``progress`` shows a progress bar on stderr (:class:`~aenvs._live.ProgressBar`); ``view``
    (entered) is handed the counts of each batch and refreshed while the loop waits.
    """
    ticker = asyncio.get_running_loop().create_task(view.ticker()) if view is not None else None
    try:
        return await _step_randomly(pool, steps, seed=seed, progress=progress, view=view)
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.wait([ticker])


async def _step_randomly(
    pool: AsyncEnvPool, steps: int, *, seed: int | None, progress: bool, view: LiveView | None
) -> RunSummary:
    from aenvs._live import ProgressBar

    sampler = RandomActions(pool.env_specs, dense=pool.is_dense, seed=seed)
    returns = np.zeros(pool.num_envs)  # of the episode running in each env
    lengths = np.zeros(pool.num_envs, dtype=np.int64)
    episodes, return_sum, length_sum = 0, 0.0, 0
    td = await pool.reset()
    done_steps = 0
    started = time.perf_counter()
    with ProgressBar(steps, enabled=progress) as bar:
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
            bar.update(done_steps)
            if view is not None:
                view.update(done_steps, episodes)
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
    from aenvs._live import LiveView, view_mode
    from aenvs._pool import AsyncEnvPool

    pool = AsyncEnvPool(
        args.env_id,
        num_envs=args.num_envs,
        executor=args.executor,
        stack=args.stack,
        seed=args.seed,
        envs_per_worker=args.envs_per_worker,
        max_concurrency=args.max_concurrency,
        rate_limit=args.rate_limit,
        episode_timeout=args.episode_timeout,
        step_timeout=args.step_timeout,
        on_timeout=args.on_timeout,
    )
    progress = not args.no_progress
    mode = view_mode(args.live, progress=progress, is_terminal=sys.stdout.isatty())
    async with pool:
        stack = "dense" if pool.is_dense else "lazy"
        print(
            f"aenvs run: {args.env_id} x {args.num_envs} envs, executor={args.executor}, "
            f"stack={stack}, loop={type(asyncio.get_running_loop()).__module__.split('.')[0]}",
            flush=True,
        )
        with LiveView(pool, mode=mode, total_steps=args.steps) as view:
            summary = await run_random(
                pool,
                args.steps,
                seed=args.seed,
                progress=progress and mode == "off",  # the live view shows the progress
                view=view if mode != "off" else None,
            )
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


# The option types raise ArgumentTypeError for any bad value, whose message argparse shows
# (for a ValueError it would name the function).


def _positive_int(text: str) -> int:
    with contextlib.suppress(ValueError):
        if (value := int(text)) >= 1:
            return value
    raise argparse.ArgumentTypeError(f"invalid positive integer: {text!r}")


def _positive_seconds(text: str) -> float:
    with contextlib.suppress(ValueError):
        if math.isfinite(value := float(text)) and value > 0:
            return value
    raise argparse.ArgumentTypeError(f"invalid number of seconds (> 0): {text!r}")


def _rate_limit(text: str) -> RateLimit:
    """``PER_SECOND[:BURST]`` as a RateLimit (BURST defaults to 1)."""
    per_second, _, burst = text.partition(":")
    try:
        return RateLimit(float(per_second), int(burst) if burst else 1)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"expected PER_SECOND[:BURST] (e.g. 20 or 20:5): {exc}") from None


def _add_run_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="step a pool of envs with random actions; report steps/s and episode returns",
        description=(
            "Step NUM_ENVS copies of a gymnasium env with random actions (each env's action "
            "sampled from its own action space), resetting envs whose episode ends, for STEPS "
            "env steps in all. Prints steps/s, the number of finished episodes, their mean "
            "return and length, and the mean step latency. On a terminal a live view shows, a "
            "few times a second, steps/s, episodes/s, envs in flight and held by the limits, "
            "the p50/p90/p99 of the time in the env, waiting for the policy and waiting on "
            "limits, and the errors, restarts and timeouts so far."
        ),
        epilog=(
            "examples: aenvs run CartPole-v1 --num-envs 16 --executor inline --steps 50000; "
            "aenvs run my_pkg:Web-v0 -n 64 --max-concurrency 16 --rate-limit 20:5 "
            "--episode-timeout 120 --step-timeout 30 --on-timeout truncate"
        ),
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
        help=(
            "where the envs run: on the event loop, on worker threads, in worker processes or in Ray "
            "actors (ray: pip install 'aenvs[ray]')"
        ),
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
    parser.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (and the live view, unless --live)"
    )
    parser.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=(
            "a live view of steps/s, episodes/s, envs in flight and held, p50/p90/p99 of the time in "
            "the env, waiting for the policy and waiting on limits, errors, restarts and timeouts "
            "(default: on when stdout is a terminal; off a terminal, --live prints a line now and then)"
        ),
    )
    limits = parser.add_argument_group("limits and deadlines (passed to the pool)")
    limits.add_argument(
        "--max-concurrency",
        type=_positive_int,
        default=None,
        metavar="N",
        help="at most N env commands running at once; the others are held by the pool",
    )
    limits.add_argument(
        "--rate-limit",
        type=_rate_limit,
        default=None,
        metavar="PER_SECOND[:BURST]",
        help="at most PER_SECOND env commands a second, BURST at once after a pause (default BURST: 1)",
    )
    limits.add_argument(
        "--episode-timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="end an episode that lasts longer (see --on-timeout)",
    )
    limits.add_argument(
        "--step-timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="stop a step that lasts longer and rebuild its env (see --on-timeout)",
    )
    limits.add_argument(
        "--on-timeout",
        choices=("raise", "truncate"),
        default="raise",
        help="a timed-out step or episode stops the run with an error, or ends its episode as truncated",
    )
    parser.set_defaults(func=_cmd_run)


# -- aenvs bench -----------------------------------------------------------------------


def _checkout() -> Path | None:
    """The checkout of aenvs whose ``benchmarks/`` suite ``aenvs bench`` runs: the one this
    aenvs is imported from (an editable install), else the current folder or one above it;
    None outside a checkout (an aenvs installed from a wheel, run elsewhere)."""
    here = Path(aenvs.__file__).resolve().parents[2]
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
            "aenvs bench: the benchmark suite is not in the aenvs package: it runs from a checkout "
            "of the repository, which installs its peers (gymnasium, TorchRL, EnvPool, Ray) in a venv "
            f"of its own:\n\n    git clone {REPOSITORY} && cd aenvs && make bench\n",
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
    except MissingExtraError as exc:  # an option needs an extra (-e ray without Ray)
        print(f"aenvs {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The live view of ``aenvs run`` and the limit and deadline options it passes to the pool."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

import aenvs._pool
from aenvs import AsyncEnvPool
from aenvs._live import LiveFigures, LiveView, format_seconds, view_mode
from aenvs._pool.stats import LatencyPercentiles, PoolStats
from aenvs.cli import EXECUTORS, LOOPS, main, run_random
from tests.cli_envs import LONG, SLEEPY, STALL
from tests.conftest import PoolFactory

ROOT = Path(__file__).resolve().parent.parent
NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
LOOP_NAMES = [loop for loop in LOOPS if loop != "auto"]


def live_counts(out: str) -> dict[str, int]:
    """The counts of the last ``live:`` line of ``out``."""
    line = [x for x in out.splitlines() if x.startswith("live: ")][-1]
    ((steps, episodes),) = re.findall(r"^live: ([0-9,]+)(?:/[0-9,]+)? steps, ([0-9,]+) episodes in", line)
    counts = {"steps": int(steps.replace(",", "")), "episodes": int(episodes.replace(",", ""))}
    for name in ("in flight", "held", "errors", "restarts", "timeouts"):
        (value,) = re.findall(rf"{name} ([0-9]+)", line)
        counts[name] = int(value)
    return counts


def limit_spread(out: str) -> str:
    """The ``limits p50 / p90 / p99`` of the last ``live:`` line."""
    line = [x for x in out.splitlines() if x.startswith("live: ")][-1]
    (spread,) = re.findall(r"limits ([^|]*) \|", line)
    return spread


def stats_of(**fields: Any) -> PoolStats:
    base: dict[str, Any] = {
        "steps": [0],
        "step_latency_mean": [0.0],
        "step_latency_last": [0.0],
        "errors": [0],
        "in_flight": 0,
        "ready": 0,
        "steps_per_second": 0.0,
        "uptime": 0.0,
        "restarts": [0],
        "timeouts": [0],
        "abandoned_threads": 0,
    }
    return PoolStats(**(base | fields))


# -- the view ---------------------------------------------------------------------------


def test_view_mode_follows_the_flags_and_the_terminal() -> None:
    assert view_mode(None, progress=True, is_terminal=True) == "table"
    assert view_mode(None, progress=False, is_terminal=True) == "off"  # --no-progress: quiet
    assert view_mode(None, progress=True, is_terminal=False) == "off"  # CI, a pipe: nothing
    assert view_mode(True, progress=False, is_terminal=False) == "lines"
    assert view_mode(True, progress=True, is_terminal=True) == "table"
    assert view_mode(False, progress=True, is_terminal=True) == "off"


def test_figures_render_the_pool_wide_percentiles() -> None:
    env = LatencyPercentiles([0.001], [0.002], [0.003], 0.0105, 0.0205, 0.0305, [5])
    stats = stats_of(env_latency=env, in_flight=3, held=2, errors=[4], restarts=[5], timeouts=[6])
    first = LiveFigures.read(stats, steps=100, episodes=10, elapsed=2.0, total_steps=400)
    later = LiveFigures.read(stats, steps=300, episodes=30, elapsed=3.0, total_steps=400, previous=first)
    assert (first.steps_per_second, later.steps_per_second) == (50.0, 200.0)  # since the previous
    assert (first.episodes_per_second, later.episodes_per_second) == (5.0, 20.0)
    assert later.env_latency == (0.0105, 0.0205, 0.0305)
    out = io.StringIO()
    Console(file=out, width=100).print(later.render())
    text = out.getvalue()
    assert "300/400 steps, 30 episodes in 3.0 s" in text
    assert "200 steps/s" in text and "20.0 episodes/s" in text and "in flight 3" in text and "held 2" in text
    (env_row,) = [row for row in text.splitlines() if row.startswith("in the env")]
    assert env_row.split()[3:] == ["10.5", "ms", "20.5", "ms", "30.5", "ms"]
    (limit_row,) = [row for row in text.splitlines() if row.startswith("waiting on limits")]
    assert limit_row.split()[3:] == ["-", "-", "-"]  # no sample: no limits
    assert "errors 4   restarts 5   timeouts 6" in text


class _SlowStats:
    """A pool whose ``stats()`` takes ``cost`` seconds of a fake clock."""

    def __init__(self, cost: float) -> None:
        self.now = 0.0
        self.cost = cost
        self.reads = 0

    def clock(self) -> float:
        return self.now

    def stats(self) -> PoolStats:
        self.now += self.cost
        self.reads += 1
        return stats_of()


def test_view_reads_stats_at_most_every_interval_and_less_when_they_are_slow() -> None:
    pool = _SlowStats(cost=0.0)
    with LiveView(pool, mode="lines", file=io.StringIO(), interval=0.25, clock=pool.clock) as view:
        for step in range(99):  # a batch every 10 ms for 0.99 s
            pool.now += 0.01
            view.update(step, 0)
        assert pool.reads == 3  # at 0.25, 0.5, 0.75
        pool.cost = 0.1  # a big pool: stats() takes 100 ms, the next reads wait 2 s (5%)
        pool.now = 1.01
        view.update(100, 0)
        assert pool.reads == 4
        read_at = pool.now
        while pool.now < read_at + 1.99:
            pool.now += 0.01
            view.update(101, 0)
        assert pool.reads == 4 and view.stats_seconds == pytest.approx(0.1)
        pool.now += 0.02
        view.update(102, 0)
        assert pool.reads == 5
    assert pool.reads == 6  # the final figures


async def test_live_view_shows_the_pools_figures(make_pool: PoolFactory) -> None:
    pool = await make_pool(SLEEPY, num_envs=3, max_concurrency=1, seed=0)
    out = io.StringIO()
    with LiveView(pool, mode="table", total_steps=12, file=out) as view:
        summary = await run_random(pool, 12, seed=0, progress=False, view=view)
    stats = pool.stats()
    figures = view.figures
    assert figures is not None and view.refreshes >= 1
    assert (figures.steps, figures.episodes, summary.episodes) == (
        12,
        3,
        3,
    )  # 4 steps an env: one episode each
    assert figures.in_flight == figures.held == 0
    assert (figures.errors, figures.restarts, figures.timeouts) == (0, 0, 0)
    env = stats.env_latency
    assert figures.env_latency == (env.pool_p50, env.pool_p90, env.pool_p99)
    assert env.pool_p50 >= 0.002  # each step sleeps 2 ms
    assert figures.limit_wait[2] > 0  # one env at a time: the others were held
    text = out.getvalue()
    assert "12/12 steps, 3 episodes" in text
    (env_row,) = [row for row in text.splitlines() if row.startswith("in the env")]
    assert format_seconds(env.pool_p50) in env_row and format_seconds(env.pool_p99) in env_row


class _TickingClock:
    """A clock 1 ms later at every read, but for the read right after a ``stats()`` read, so
    that reads cost no time: the view's wait stays its interval (a slow read on a busy machine
    would stretch it past the run) and the refresh count does not depend on the machine."""

    def __init__(self) -> None:
        self.now, self.hold = 0.0, False

    def __call__(self) -> float:
        if self.hold:
            self.hold = False
        else:
            self.now += 0.001
        return self.now


class _StatsOnClock:
    """``pool.stats()`` read in no time on ``clock``."""

    def __init__(self, pool: Any, clock: _TickingClock) -> None:
        self._pool, self._clock = pool, clock

    def stats(self) -> Any:
        self._clock.hold = True
        return self._pool.stats()


async def test_live_view_refreshes_while_the_loop_waits(make_pool: PoolFactory) -> None:
    pool = await make_pool(LONG, num_envs=1)
    out = io.StringIO()
    clock = _TickingClock()
    source = _StatsOnClock(pool, clock)
    with LiveView(source, mode="lines", total_steps=8, file=out, interval=0.001, clock=clock) as view:
        await run_random(pool, 8, seed=0, progress=False, view=view)
    lines = out.getvalue().splitlines()
    assert len(lines) == view.refreshes >= 8  # a refresh is due at every batch: 1 ms has passed
    assert lines[-1].startswith("live: 8/8 steps")


# -- the options, in process ------------------------------------------------------------


class _RecordingPool(AsyncEnvPool):
    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _RecordingPool.made.append(kwargs)
        super().__init__(*args, **kwargs)


def test_cli_passes_the_limit_and_deadline_options_to_the_pool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(aenvs._pool, "AsyncEnvPool", _RecordingPool)
    _RecordingPool.made.clear()
    argv = ["run", SLEEPY, "-n", "2", "-e", "thread", "--steps", "4", "--no-progress"]
    options = ["--max-concurrency", "2", "--rate-limit", "500:3", "--episode-timeout", "1.5"]
    assert main([*argv, *options, "--step-timeout", "0.5", "--on-timeout", "truncate"]) == 0
    assert main(argv) == 0
    given, default = _RecordingPool.made
    rate_limit = given["rate_limit"]
    assert (rate_limit.per_second, rate_limit.burst) == (500.0, 3)
    assert given["max_concurrency"] == 2 and given["episode_timeout"] == 1.5
    assert given["step_timeout"] == 0.5 and given["on_timeout"] == "truncate"
    assert default["max_concurrency"] is None and default["rate_limit"] is None
    assert default["episode_timeout"] is None and default["step_timeout"] is None
    assert default["on_timeout"] == "raise"
    assert "live:" not in capsys.readouterr().out  # not a terminal, not asked


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--rate-limit", "fast"], "PER_SECOND[:BURST]"),
        (["--rate-limit", "10:0"], "burst must be >= 1"),
        (["--rate-limit", "0"], "per_second must be"),
        (["--max-concurrency", "0"], "invalid positive integer: '0'"),
        (["--episode-timeout", "-1"], "invalid number of seconds (> 0): '-1'"),
        (["--on-timeout", "skip"], "invalid choice"),
    ],
)
def test_cli_refuses_bad_limit_options(
    option: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("loop", LOOP_NAMES)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_cli_limits_hold_commands(executor: str, loop: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", SLEEPY, "-n", "3", "-e", executor, "--loop", loop, "--steps", "12", "--seed", "0"]
    assert main([*argv, "--max-concurrency", "1", "--rate-limit", "1000:1", "--live"]) == 0
    out = capsys.readouterr().out
    assert f"loop={loop}" in out
    counts = live_counts(out)
    assert counts == {
        "steps": 12,
        "episodes": 3,
        "in flight": 0,
        "held": 0,
        "errors": 0,
        "restarts": 0,
        "timeouts": 0,
    }
    assert "-" not in limit_spread(out)  # commands were held: the limits have samples
    assert main([*argv, "--live"]) == 0
    assert limit_spread(capsys.readouterr().out) == "- / - / -"  # no limits, no samples


@pytest.mark.parametrize("executor", [e for e in EXECUTORS if e != "inline"])
def test_cli_step_timeout_truncates_or_raises(executor: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", STALL, "-n", "2", "-e", executor, "--steps", "6", "--step-timeout", "0.1", "--live"]
    assert main([*argv, "--on-timeout", "truncate"]) == 0
    out = capsys.readouterr().out
    counts = live_counts(out)
    # each env: two steps, then the stalled third times out (an episode ends), then two more
    assert counts["steps"] == 6 and counts["episodes"] == 2
    assert counts["timeouts"] == 2 and counts["errors"] == 0
    assert re.search(rf"^episodes finished: +{NUMBER}$", out, re.MULTILINE) is not None
    assert main([*argv, "--on-timeout", "raise"]) == 1
    assert "error: env" in capsys.readouterr().err


@pytest.mark.parametrize("executor", EXECUTORS)
def test_cli_episode_timeout_truncates_episodes(executor: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", LONG, "-n", "2", "-e", executor, "--steps", "24", "--live"]
    assert main([*argv, "--episode-timeout", "0.03", "--on-timeout", "truncate"]) == 0
    out = capsys.readouterr().out
    counts = live_counts(out)
    (length,) = [float(x) for x in re.findall(rf"^mean episode length: {NUMBER}$", out, re.MULTILINE)]
    assert counts["timeouts"] >= counts["episodes"] >= 2  # only deadlines end them
    assert length < 12  # 5 ms steps, 30 ms episodes


# -- end to end, in a fresh interpreter ---------------------------------------------------


def test_aenvs_run_prints_live_lines_off_a_terminal() -> None:
    command = [sys.executable, "-m", "aenvs", "run", SLEEPY, "-n", "3", "-e", "thread", "--steps", "24"]
    options = [
        "--max-concurrency",
        "2",
        "--rate-limit",
        "2000:2",
        "--episode-timeout",
        "5",
        "--on-timeout",
        "truncate",
    ]
    result = subprocess.run(
        [*command, *options, "--live"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert live_counts(result.stdout)["steps"] == 24
    assert "-" not in limit_spread(result.stdout)
    assert re.search(r"^steps: +24 in", result.stdout, re.MULTILINE)


def run_on_a_terminal(argv: list[str], timeout: float = 60) -> str:
    """Run ``python -m aenvs argv`` with a pseudo-terminal as stdout and stderr; its output."""
    main_fd, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "aenvs", *argv],
        cwd=ROOT,
        stdout=terminal,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
    )
    os.close(terminal)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main_fd], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the child closed the terminal: it exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=max(0.0, deadline - time.monotonic())) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main_fd)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))


def test_aenvs_run_shows_a_live_table_on_a_terminal() -> None:
    out = run_on_a_terminal(
        ["run", SLEEPY, "-n", "2", "-e", "inline", "--steps", "16", "--max-concurrency", "1"]
    )
    assert "16/16 steps, 4 episodes" in out
    for row in (
        "in the env",
        "waiting for the policy",
        "waiting on limits",
        "errors 0   restarts 0   timeouts 0",
    ):
        assert row in out
    assert re.search(r"^steps: +16 in", out, re.MULTILINE)

"""The live view of ``aenvs run``: throughput, envs in flight and latency percentiles, refreshed
a few times a second from :meth:`~aenvs.AsyncEnvPool.stats`.

The loop it watches only hands it two counters per batch (:meth:`LiveView.update`: a clock
read, nothing more unless a refresh is due). A refresh reads ``stats()``, whose cost grows
with the pool (percentiles over every env's window), on the event loop: the view times each
read and spaces the next one so that reading stays a small share of the loop's time.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Literal, Protocol

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from aenvs._pool.stats import LatencyPercentiles, PoolStats

__all__ = ["LiveFigures", "LiveView", "ProgressBar", "ViewMode", "format_seconds", "view_mode"]

ViewMode = Literal["table", "lines", "off"]

TABLE_INTERVAL = 0.25  # seconds between refreshes of the table, at least
LINE_INTERVAL = 2.0  # seconds between plain lines (a log, a CI job), at least
STATS_SHARE = 0.05  # at most this share of the time goes to reading stats()
BAR_INTERVAL = 0.1  # seconds between redraws of the progress bar, at least


class _StatsSource(Protocol):
    def stats(self) -> PoolStats: ...


def view_mode(live: bool | None, *, progress: bool, is_terminal: bool) -> ViewMode:
    """How to show the run: ``live`` True/False is the user's ``--live`` / ``--no-live``;
    None (neither) means a table on a terminal unless ``progress`` is off, else nothing.
    Asked for off a terminal, the view prints plain lines.

    Example:
        >>> view_mode(None, progress=True, is_terminal=True), view_mode(True, progress=True, is_terminal=False)
        ('table', 'lines')
        >>> view_mode(None, progress=True, is_terminal=False)
        'off'
    """
    if live is False or (live is None and not (progress and is_terminal)):
        return "off"
    return "table" if is_terminal else "lines"


def format_seconds(seconds: float) -> str:
    """A duration for a human: microseconds, milliseconds or seconds, three digits or so.

    Example:
        >>> format_seconds(0.000042), format_seconds(0.0123), format_seconds(2.5), format_seconds(math.nan)
        ('42 µs', '12.3 ms', '2.50 s', '-')
    """
    if math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        ms = seconds * 1e3
        return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{seconds:.2f} s"


def _pool_percentiles(p: LatencyPercentiles) -> tuple[float, float, float]:
    """(p50, p90, p99) over every env, NaN when no env has a sample."""
    if not any(p.samples):
        return (math.nan, math.nan, math.nan)
    return (p.pool_p50, p.pool_p90, p.pool_p99)


@dataclass(frozen=True)
class LiveFigures:
    """What the view shows at one refresh.

    Rates are over the time since the previous refresh (since the start for the first);
    latencies are the pool-wide p50 / p90 / p99 in seconds (NaN: no sample yet).

    Example:
        >>> from aenvs._pool.stats import PoolStats
        >>> stats = PoolStats(steps=[10, 10], step_latency_mean=[0.0] * 2, step_latency_last=[0.0] * 2,
        ...     errors=[1, 0], in_flight=2, ready=0, steps_per_second=0.0, uptime=1.0, restarts=[0, 1],
        ...     timeouts=[0, 2], abandoned_threads=0)
        >>> f = LiveFigures.read(stats, steps=20, episodes=4, elapsed=2.0, total_steps=100)
        >>> f.steps_per_second, f.episodes_per_second, f.errors, f.restarts, f.timeouts
        (10.0, 2.0, 1, 1, 2)
    """

    elapsed: float
    steps: int
    total_steps: int | None
    steps_per_second: float
    episodes: int
    episodes_per_second: float
    in_flight: int
    held: int
    env_latency: tuple[float, float, float]
    policy_wait: tuple[float, float, float]
    limit_wait: tuple[float, float, float]
    errors: int
    restarts: int
    timeouts: int

    @classmethod
    def read(
        cls,
        stats: PoolStats,
        *,
        steps: int,
        episodes: int,
        elapsed: float,
        total_steps: int | None = None,
        previous: LiveFigures | None = None,
    ) -> LiveFigures:
        """The figures of ``stats`` and the loop's counters, rates since ``previous``."""
        since = previous.elapsed if previous is not None else 0.0
        span = elapsed - since
        done_steps = steps - (previous.steps if previous is not None else 0)
        done_episodes = episodes - (previous.episodes if previous is not None else 0)
        return cls(
            elapsed=elapsed,
            steps=steps,
            total_steps=total_steps,
            steps_per_second=done_steps / span if span > 0 else 0.0,
            episodes=episodes,
            episodes_per_second=done_episodes / span if span > 0 else 0.0,
            in_flight=stats.in_flight,
            held=stats.held,
            env_latency=_pool_percentiles(stats.env_latency),
            policy_wait=_pool_percentiles(stats.policy_wait),
            limit_wait=_pool_percentiles(stats.limit_wait),
            errors=sum(stats.errors),
            restarts=sum(stats.restarts),
            timeouts=sum(stats.timeouts),
        )

    def _progress(self) -> str:
        total = f"/{self.total_steps:,}" if self.total_steps is not None else ""
        return f"{self.steps:,}{total} steps, {self.episodes:,} episodes in {self.elapsed:.1f} s"

    def render(self) -> Group:
        """The figures for a terminal: progress, rates and counts, and a table of latencies."""
        table = Table(show_edge=False, pad_edge=False, box=box.SIMPLE_HEAD)
        table.add_column("latency")
        for name in ("p50", "p90", "p99"):
            table.add_column(name, justify="right")
        for name, p in (
            ("in the env", self.env_latency),
            ("waiting for the policy", self.policy_wait),
            ("waiting on limits", self.limit_wait),
        ):
            table.add_row(name, *(format_seconds(s) for s in p))
        return Group(
            Text(self._progress(), style="bold"),
            Text(
                f"{self.steps_per_second:,.0f} steps/s   {self.episodes_per_second:,.1f} episodes/s   "
                f"in flight {self.in_flight}   held {self.held}"
            ),
            table,
            Text(f"errors {self.errors}   restarts {self.restarts}   timeouts {self.timeouts}"),
        )

    def line(self) -> str:
        """The figures on one plain line (what a log or a CI job shows).

        Example:
            >>> f = LiveFigures(1.0, 5, 10, 5.0, 1, 1.0, 2, 0, (0.001, 0.002, 0.003), (math.nan,) * 3,
            ...     (math.nan,) * 3, 0, 0, 0)
            >>> f.line()
            'live: 5/10 steps, 1 episodes in 1.0 s | 5 steps/s, 1.0 episodes/s | in flight 2, held 0 | env 1.00 ms / 2.00 ms / 3.00 ms, policy - / - / -, limits - / - / - | errors 0, restarts 0, timeouts 0'
        """

        def spread(p: tuple[float, float, float]) -> str:
            return " / ".join(format_seconds(s) for s in p)

        return (
            f"live: {self._progress()} | {self.steps_per_second:,.0f} steps/s, "
            f"{self.episodes_per_second:,.1f} episodes/s | in flight {self.in_flight}, held {self.held} | "
            f"env {spread(self.env_latency)}, policy {spread(self.policy_wait)}, "
            f"limits {spread(self.limit_wait)} | "
            f"errors {self.errors}, restarts {self.restarts}, timeouts {self.timeouts}"
        )


class LiveView:
    """Shows a running pool's figures: a table redrawn in place on a terminal (``"table"``),
    a plain line now and then elsewhere (``"lines"``), or nothing (``"off"``).

    Use it as a context manager around the loop; the loop calls :meth:`update` once per batch
    with its step and episode counts, and :meth:`ticker` (a task) refreshes it while the loop
    waits. Leaving the ``with`` block shows the final figures (rates over the whole run).

    Args:
        pool: what to read ``stats()`` from (a started pool).
        mode: see :func:`view_mode`.
        total_steps: the steps the run will take (shown as progress), or None.
        file: where to write (default: stdout).
        interval: seconds between refreshes, at least (default: 0.25 for a table, 2 for lines);
            a pool whose ``stats()`` is slow is read less often (at most 5% of the time).
        clock: the clock, in seconds (tests pass a fake one).

    Example:
        >>> import asyncio, io
        >>> import aenvs
        >>> async def main():
        ...     out = io.StringIO()
        ...     async with aenvs.AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
        ...         with LiveView(pool, mode="lines", total_steps=4, file=out) as view:
        ...             await pool.reset()
        ...             for step in (2, 4):
        ...                 await pool.rand_step()
        ...                 view.update(step, 0)
        ...     return out.getvalue()
        >>> print(asyncio.run(main()))  # doctest: +ELLIPSIS
        live: 4/4 steps, 0 episodes in ... | in flight 0, held 0 | env ... | errors 0, restarts 0, timeouts 0
        <BLANKLINE>
    """

    def __init__(
        self,
        pool: _StatsSource,
        *,
        mode: ViewMode,
        total_steps: int | None = None,
        file: IO[str] | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self.mode: ViewMode = mode
        self._total = total_steps
        self._file = file
        self._clock = clock
        self._interval = (
            interval if interval is not None else TABLE_INTERVAL if mode == "table" else LINE_INTERVAL
        )
        self._wait = self._interval  # grows when stats() is slow
        self._started = clock()
        self._due = math.inf  # no refresh before __enter__
        self.steps = 0
        self.episodes = 0
        self.figures: LiveFigures | None = None  # the last ones shown
        self.stats_seconds = 0.0  # what the last stats() read cost
        self.refreshes = 0
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.mode == "off":
            return self
        self._started = self._clock()
        self._due = self._started + self._wait
        if self.mode == "table":
            console = Console(file=self._file) if self._file is not None else Console()
            self._live = Live(console=console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.mode == "off":
            return
        self._due = math.inf
        self.figures = None  # the final figures: rates over the whole run
        try:
            self.refresh()  # they stay on screen
        finally:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def update(self, steps: int, episodes: int) -> None:
        """The loop's counts (once per batch); refresh if one is due."""
        self.steps = steps
        self.episodes = episodes
        if self._clock() >= self._due:
            self.refresh()

    def refresh_if_due(self) -> None:
        """Refresh if one is due (the ticker, between the loop's batches)."""
        if self._clock() >= self._due:
            self.refresh()

    def refresh(self) -> None:
        """Read ``stats()`` and show the figures now."""
        if self.mode == "off":
            return
        read_at = self._clock()
        stats = self._pool.stats()
        now = self._clock()
        self.stats_seconds = now - read_at
        self._wait = max(self._interval, self.stats_seconds / STATS_SHARE)
        if self._due != math.inf:
            self._due = now + self._wait
        self.figures = LiveFigures.read(
            stats,
            steps=self.steps,
            episodes=self.episodes,
            elapsed=now - self._started,
            total_steps=self._total,
            previous=self.figures,
        )
        self.refreshes += 1
        if self._live is not None:
            self._live.update(self.figures.render(), refresh=True)
        else:
            print(self.figures.line(), file=self._file or sys.stdout, flush=True)

    async def ticker(self) -> None:
        """Refresh while the loop awaits (run as a task; cancel it when the loop ends)."""
        if self.mode == "off":
            return
        while True:
            await asyncio.sleep(max(0.0, self._due - self._clock()) if self._due != math.inf else self._wait)
            self.refresh_if_due()


class ProgressBar:
    """The steps done out of ``total``, as a bar on stderr: what ``aenvs run`` shows when the
    live view is off. Redrawn in place on a terminal, at most every ``interval`` seconds, by
    the loop's own :meth:`update` (no thread of its own); elsewhere (a pipe, a log) drawn
    once, when the ``with`` block ends. ``enabled=False`` shows nothing.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with ProgressBar(100, file=out) as bar:
        ...     bar.update(60)
        ...     bar.update(100)
        >>> "100/100 steps" in out.getvalue()
        True
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        file: IO[str] | None = None,
        interval: float = BAR_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._due = 0.0
        console = Console(file=file) if file is not None else Console(stderr=True)
        self._progress = Progress(
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            disable=not enabled,
        )
        self._task = self._progress.add_task("steps", total=total)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()  # the last figures stay on screen (and are all a pipe gets)

    def update(self, completed: int) -> None:
        """The steps done so far (once per batch); redraw if one is due."""
        now = self._clock()
        due = now >= self._due
        if due:
            self._due = now + self._interval
        self._progress.update(self._task, completed=completed, refresh=due)

"""PNG plots of benchmark rows (matplotlib's object API: no pyplot, no global backend state).

One figure a plot, sized to read at a page's width. Each system keeps its colour in every
plot: aenvs in shades of blue (a shade and marker per executor, a line style per variant
such as overlapped or pinned), each peer a colour of its own (gymnasium green, TorchRL
orange, EnvPool purple, Ray brown), hand-written loops and bare references in greys, the
bound black. A plot whose rows all share one x value is drawn as bars.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .suite import Plot

__all__ = ["Style", "draw", "styles"]

WIDTH = 7.4  # inches: at 120 dpi, about the width of the docs' text column
DPI = 120
FONT: dict[Any, Any] = {"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10}

# aenvs: one hue; per executor a shade and a marker
EXECUTORS = {
    "inline": ("#08306b", "o"),
    "thread": ("#2171b5", "s"),
    "process": ("#4a98d3", "^"),
    "ray": ("#7cb6e4", "D"),
}
# each peer its own colour; per class a marker (the first key the name contains)
PEERS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "gymnasium": ("#2ca02c", (("async", "s"), ("sync", "o"))),
    "torchrl": ("#e6740a", (("asyncenvpool", "v"), ("serial", "o"), ("parallel", "^"))),
    "envpool": ("#8e44ad", ()),
    "ray": ("#8c564b", ()),
}
LINES = ("-", "--", "-.", ":")
REFERENCE_COLORS = ("#3a3a3a", "#8a8a8a")
REFERENCE_MARKERS = ("P", "X", "v", "<", ">", "h", "*", "p")


@dataclass(frozen=True)
class Style:
    """How one series is drawn: its colour, marker and line style (marker None: a plain line)."""

    color: str
    marker: str | None
    line: str
    family: str  # "aenvs", a peer's name, "bound" or "reference"


def _family(name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("aenvs"):
        return "aenvs"
    if "ray.get" in lowered:
        return "ray"
    for peer in ("gymnasium", "torchrl", "envpool"):
        if lowered.startswith(peer):
            return peer
    if "bound" in lowered or lowered == "ideal":
        return "bound"
    return "reference"


def _executor(name: str) -> str:
    lowered = name.lower()
    for executor in ("thread", "process", "ray"):
        if re.search(rf"\b{executor}\b", lowered):
            return executor
    return "process" if "parallelenv" in lowered else "inline"  # SerialEnv, collect: inline


def _variant(name: str) -> int:
    """0 for a system's plain form, 1-3 for its variants (a line style each)."""
    lowered = name.lower()
    if "[gym]" in lowered or "serve" in lowered:
        return 2
    if any(word in lowered for word in ("overlapped", "max_get", "pinned", ".torchrl.", "hand-written")):
        return 1
    if re.search(r"\bray\b.*lockstep", lowered):
        return 1
    return 0


def _system_style(name: str) -> Style | None:
    family = _family(name)
    if family == "aenvs":
        color, marker = EXECUTORS[_executor(name)]
        return Style(color, marker, LINES[_variant(name)], family)
    if family in PEERS:
        color, markers = PEERS[family]
        lowered = name.lower().replace(" ", "")
        marker = next((m for key, m in markers if key in lowered), "o")
        return Style(color, marker, "--" if "noshm" in lowered else "-", family)
    if family == "bound":
        return Style("black", None, ":", family)
    return None


def styles(names: Sequence[str]) -> dict[str, Style]:
    """The style of each series of one plot: aenvs and the peers as everywhere, the
    references in greys with markers of their own; no two series of a plot drawn alike.

    Example:
        >>> styles(["aenvs process lockstep", "gymnasium AsyncVectorEnv"])["aenvs process lockstep"].marker
        '^'
    """
    found: dict[str, Style] = {}
    used: set[tuple[str, str | None, str]] = set()
    references = 0
    for name in names:
        style = _system_style(name)
        if style is None:  # a hand-written loop or a bare reference
            style = Style(
                REFERENCE_COLORS[references % 2],
                REFERENCE_MARKERS[references % len(REFERENCE_MARKERS)],
                LINES[1 + references % 3],
                "reference",
            )
            references += 1
        for line in (style.line, *LINES):  # a clash (two variants alike): the next free line
            if (style.color, style.marker, line) not in used:
                style = Style(style.color, style.marker, line, style.family)
                break
        used.add((style.color, style.marker, style.line))
        found[name] = style
    return found


def _number(value: Any) -> float | None:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None
    )


def _short(value: float, _: object = None) -> str:
    """A tick label: 500, 2k, 100k, 1.5M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _order(name: str) -> tuple[int, int, int]:
    """aenvs first (by executor, then variant), then the peers, the references, the bound;
    series that tie keep the order of the rows."""
    family = _family(name)
    rank = ["aenvs", "gymnasium", "torchrl", "envpool", "ray", "reference", "bound"].index(family)
    executor = list(EXECUTORS).index(_executor(name)) if family == "aenvs" else 0
    return (rank, executor, _variant(name) if family == "aenvs" else 0)


def draw(plot: Plot, rows: Sequence[dict[str, Any]], path: str | Path) -> bool:
    """Draw ``plot`` from ``rows`` into ``path`` (PNG); False, and no file, if no row fits it.

    Example:
        >>> rows = [{"system": "aenvs thread", "n": 8, "steps_per_s": 900.0}]
        >>> draw(Plot("x.png", "Throughput"), rows, "x.png")
        True
    """
    from matplotlib import rc_context

    points: dict[str, list[tuple[float, float]]] = {}  # series -> (x, y)
    ideal: set[tuple[float, float]] = set()
    for row in rows:
        if any(row.get(key) != value for key, value in plot.where.items()):
            continue
        x, y, series = _number(row.get(plot.x)), _number(row.get(plot.y)), row.get(plot.series)
        if x is None or y is None or series is None:
            continue
        points.setdefault(plot.labels.get(str(series), str(series)), []).append((x, y))
        if plot.ideal is not None and (best := _number(row.get(plot.ideal))) is not None:
            ideal.add((x, best))
    if not points:
        return False
    if ideal:
        points["ideal"] = sorted(ideal)
    names = sorted(points, key=_order)
    style = styles(names)
    xs = sorted({x for line in points.values() for x, _ in line})
    with rc_context(FONT):
        if len(xs) == 1:
            figure = _bars(plot, names, points, style, xs[0])
        else:
            figure = _lines(plot, names, points, style, xs)
        figure.savefig(path, dpi=DPI)
    return True


def _lines(
    plot: Plot,
    names: Sequence[str],
    points: dict[str, list[tuple[float, float]]],
    style: dict[str, Style],
    xs: Sequence[float],
) -> Any:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    rows_of_legend = -(-len(names) // 2)
    figure = Figure(figsize=(WIDTH, 4.0 + 0.26 * rows_of_legend), layout="constrained")
    ax = figure.subplots()
    for name in names:
        line = sorted(points[name])
        s = style[name]
        ax.plot(
            [x for x, _ in line],
            [y for _, y in line],
            color=s.color,
            marker=s.marker,
            markersize=7,
            markerfacecolor=s.color if s.line == "-" else "white",  # variants: hollow markers
            linestyle=s.line,
            linewidth=2.2 if s.family == "aenvs" else 1.6,
            label=name,
        )
    ax.set_xscale("log", base=2)
    if plot.ylog:
        ys = [y for line in points.values() for _, y in line]
        narrow = max(ys) / min(ys) < 20  # under about a decade: more ticks, or none may fall inside
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(
            LogLocator(base=10, subs=(1.0, 1.5, 2, 3, 5, 7) if narrow else (1.0, 2.0, 5.0))
        )
        ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(_short))
    ax.set_xticks(list(xs), [f"{x:g}" for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(plot.xlabel)
    ax.set_ylabel(plot.ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(plot.title)
    figure.legend(loc="outside lower center", ncol=2, frameon=False, handlelength=3.2)
    return figure


def _bars(
    plot: Plot,
    names: Sequence[str],
    points: dict[str, list[tuple[float, float]]],
    style: dict[str, Style],
    x: float,
) -> Any:
    """One x value: a horizontal bar per series, its name on the axis and its value at its end."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(WIDTH, 1.3 + 0.42 * len(names)), layout="constrained")
    ax = figure.subplots()
    values = [max(y for _, y in points[name]) for name in names]
    positions = list(range(len(names)))[::-1]  # the first series on top
    bars = ax.barh(positions, values, color=[style[name].color for name in names])
    ax.bar_label(bars, labels=[_short(v) for v in values], padding=3)
    ax.set_yticks(positions, list(names))
    ax.set_xlim(0, max(values) * 1.15)
    ax.xaxis.set_major_formatter(FuncFormatter(_short))
    ax.set_xlabel(plot.ylabel)
    ax.grid(True, axis="x", alpha=0.3)
    figure.suptitle(f"{plot.title} (N = {x:g})")
    return figure

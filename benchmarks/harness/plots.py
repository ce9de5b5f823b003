"""PNG plots of benchmark rows (matplotlib's object API: no pyplot, no global backend state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .suite import Plot

__all__ = ["draw"]


def _number(value: Any) -> float | None:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None
    )


def _short(value: float, _: object = None) -> str:
    """A tick label: 500, 2k, 100k, 1.5M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _order(series: str) -> tuple[bool, str]:
    return (not series.startswith("aenvs"), series)  # aenvs first, then peers and references


def draw(plot: Plot, rows: Sequence[dict[str, Any]], path: str | Path) -> bool:
    """Draw ``plot`` from ``rows`` into ``path`` (PNG); False, and no file, if no row fits it.

    Example:
        >>> rows = [{"system": "aenvs thread", "n": 8, "steps_per_s": 900.0}]
        >>> draw(Plot("x.png", "Throughput"), rows, "x.png")
        True
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    points: dict[str, dict[str, list[tuple[float, float]]]] = {}  # panel -> series -> (x, y)
    ideal: dict[str, set[tuple[float, float]]] = {}
    for row in rows:
        x, y, series = _number(row.get(plot.x)), _number(row.get(plot.y)), row.get(plot.series)
        if x is None or y is None or series is None:
            continue
        panel = str(row.get(plot.panels, "")) if plot.panels else ""
        points.setdefault(panel, {}).setdefault(str(series), []).append((x, y))
        if plot.ideal is not None and (best := _number(row.get(plot.ideal))) is not None:
            ideal.setdefault(panel, set()).add((x, best))
    if not points:
        return False

    names = sorted({s for by_series in points.values() for s in by_series}, key=_order)
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    panels = list(points)
    width = 4.6 * len(panels) + 1.4
    figure = Figure(figsize=(width, 4.6), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels, strict=True):
        xs: set[float] = set()
        for name in sorted(points[panel], key=_order):
            line = sorted(points[panel][name])
            xs.update(x for x, _ in line)
            ax.plot(
                [x for x, _ in line],
                [y for _, y in line],
                marker="o",
                color=colors[name],
                linestyle="-" if name.startswith("aenvs") else "--",
                label=name,
            )
        if panel in ideal:
            line = sorted(ideal[panel])
            ax.plot([x for x, _ in line], [y for _, y in line], color="black", linestyle=":", label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_short))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sorted(xs), [f"{x:g}" for x in sorted(xs)])
        ax.minorticks_off()
        ax.set_xlabel(plot.xlabel)
        ax.set_ylabel(plot.ylabel)
        ax.grid(True, which="major", alpha=0.3)
        if panel:
            ax.set_title(panel)
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    figure.suptitle(plot.title)
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncol=max(1, min(4, len(handles), int(width // 2.4))),
        fontsize=8,
    )
    figure.savefig(path, dpi=110)
    return True

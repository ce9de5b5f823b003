"""The benchmark suite's runner and report (aenvs bench), on small fake benchmarks: rows,
plots, skips, failures and time-outs, and nothing left running."""

from __future__ import annotations

import dataclasses
import json

import psutil
import pytest

from aenvs import cli
from aenvs.cli import main
from benchmarks.harness import Benchmark, Plot, run_suite
from benchmarks.harness.report import load_results, make_header, write_report

FAKE = "tests.bench.fake_benchmarks"
PNG = b"\x89PNG\r\n\x1a\n"

GOOD = Benchmark(
    "good",
    "A benchmark that works",
    full={"sizes": [2, 8, 32]},
    quick={"sizes": [2, 8]},
    plots=(Plot("good.png", "Fake throughput", ideal="ideal"),),
    module=FAKE,
)


def _suite() -> list[Benchmark]:
    return [
        GOOD,
        Benchmark(
            "needs_ray", "Needs a module that is not there", requires=("no_such_module_xyz",), module=FAKE
        ),
        Benchmark("absent", "Its module is not there", module="tests.bench.no_such_benchmark"),
        Benchmark("crashes", "Raises", function="crash", module=FAKE),
        Benchmark("hangs", "Never returns", function="hang", module=FAKE, timeout=3),
    ]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_the_suite_runs_what_it_can_and_says_why_not_the_rest(tmp_path) -> None:
    before = _children()  # e.g. the process executor's zygote, started by earlier tests
    runs = run_suite(_suite(), out_dir=tmp_path, quick=True, progress=False)
    by_name = {run.benchmark.name: run for run in runs}
    assert list(by_name) == ["good", "needs_ray", "absent", "crashes", "hangs"]

    good = by_name["good"]
    assert good.ok
    assert [(r["system"], r.get("n")) for r in good.rows] == [
        ("aenvs thread", 2),
        ("a peer", 2),
        ("aenvs thread", 8),
        ("a peer", 8),
        ("aenvs process (cold zygote)", None),
    ]  # the quick arguments: N = 2 and 8
    assert good.rows[0]["steps_per_s"] == 200.0
    assert "measured N=8" in (tmp_path / "good.log").read_text()

    assert by_name["needs_ray"].skipped == "needs no_such_module_xyz, which is not installed"
    assert by_name["absent"].skipped == "its module tests.bench.no_such_benchmark is not there"
    assert by_name["crashes"].failed is not None and "the env would not start" in by_name["crashes"].failed
    assert by_name["hangs"].failed == "timed out after 3 s"
    assert "waiting forever" in (tmp_path / "hangs.log").read_text()
    assert not _children() - before  # the hung benchmark was stopped

    report = write_report(
        runs, tmp_path, make_header("aenvs bench --quick", quick=True, started=0.0)
    ).read_text()
    assert "quick run" in report
    assert "| needs_ray | skipped: needs no_such_module_xyz, which is not installed |" in report
    assert "| crashes | **failed**: exit code 1: " in report
    assert "![Fake throughput](good.png)" in report
    assert "| aenvs thread | 8 | 800 | 1,600 |" in report  # the rows, one table per kind of row
    assert "| aenvs process (cold zygote) | 0.250 | 6.00, 6.50 |" in report
    assert (tmp_path / "good.png").read_bytes().startswith(PNG)
    results = json.loads((tmp_path / "results.json").read_text())
    assert [b["name"] for b in results["benchmarks"]] == list(by_name)
    assert results["benchmarks"][0]["rows"] == good.rows


def test_replot_rewrites_report_and_plots_without_measuring(tmp_path) -> None:
    runs = run_suite([dataclasses.replace(GOOD, name="latency")], out_dir=tmp_path, progress=False)
    write_report(runs, tmp_path, make_header("aenvs bench", quick=False, started=0.0))
    (tmp_path / "good.png").unlink()
    (tmp_path / "report.md").unlink()
    loaded, header = load_results(tmp_path / "results.json")
    assert loaded[0].rows == runs[0].rows and len(runs[0].rows) == 7  # the full arguments: 3 sizes
    assert header["command"] == "aenvs bench"
    # a suite benchmark's name: drawn as the suite draws it now (latency.png)
    assert main(["bench", "--replot", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "latency.png").read_bytes().startswith(PNG)
    assert "aenvs thread | 32 | 3,200" in (tmp_path / "report.md").read_text()


def test_a_benchmarks_functions_travel_by_value_as_from_a_script(tmp_path) -> None:
    """Run as a script, a benchmark's env factories live in __main__ and are pickled by value;
    the suite keeps it so, or every worker would import the whole benchmark module."""
    bench = Benchmark("pickles", "Pickles a factory", function="pickled_factory", module=FAKE)
    (run,) = run_suite([bench], out_dir=tmp_path, progress=False)
    assert run.ok, run.failed
    assert run.rows == [{"returncode": 0, "stdout": "42"}]


def test_plots_leave_out_rows_without_their_fields(tmp_path) -> None:
    from benchmarks.harness.plots import draw

    rows = [{"system": "aenvs process (cold zygote)", "seconds": 0.25}]
    assert not draw(Plot("none.png", "Nothing to draw"), rows, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    rows += [{"system": "aenvs thread", "n": 8, "steps_per_s": 900.0, "workload": "cpu"}]
    assert not draw(Plot("no.png", "Another workload", where={"workload": "text"}), rows, tmp_path / "no.png")
    assert draw(Plot("one.png", "One point", where={"workload": "cpu"}), rows, tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes().startswith(PNG)


def test_plots_draw_each_system_alike_everywhere_and_no_two_series_alike(monkeypatch, tmp_path) -> None:
    """Over the committed suite run's plots: every series of a figure has its own colour,
    marker and line; a system has one colour in every figure; aenvs's colours are its own;
    a plot of one x value is bars."""
    from pathlib import Path

    from matplotlib.figure import Figure

    from benchmarks.harness import SUITE
    from benchmarks.harness.plots import draw

    figures: list[tuple[str, Figure]] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **_: figures.append((Path(path).name, self)))
    runs, _ = load_results(Path(__file__).resolve().parents[2] / "docs" / "bench" / "results.json")
    rows = {run.benchmark.name: run.rows for run in runs}
    for benchmark in SUITE:
        for plot in benchmark.plots:
            assert draw(plot, rows[benchmark.name], tmp_path / plot.file), plot.file
    assert len(figures) == sum(len(b.plots) for b in SUITE)

    colour_of: dict[str, set[str]] = {}
    for name, figure in figures:
        (ax,) = figure.axes
        lines = [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
        if not lines:  # bars: one per series, each named on the axis
            assert ax.patches and len(ax.patches) == len(ax.get_yticklabels()), name
            continue
        looks = [(line.get_color(), line.get_marker(), line.get_linestyle()) for line in lines]
        assert len(set(looks)) == len(looks), (name, [line.get_label() for line in lines])
        for line in lines:  # aenvs and the peers (the references are greys of each plot's own)
            system = str(line.get_label()).split(",")[0].split(" (")[0]
            if system.startswith(("aenvs", "gymnasium", "torchrl", "envpool", "naive ray")):
                colour_of.setdefault(system, set()).add(str(line.get_color()))
    assert all(len(colours) == 1 for colours in colour_of.values()), colour_of
    ours = {c for system, (c,) in colour_of.items() if system.startswith("aenvs")}
    theirs = {c for system, (c,) in colour_of.items() if not system.startswith("aenvs")}
    assert ours and theirs and not ours & theirs
    gymnasium = {c for system, (c,) in colour_of.items() if system.startswith("gymnasium")}
    assert len(gymnasium) == 1


def test_cli_lists_the_suite_and_refuses_unknown_names(capsys) -> None:
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"latency", "throughput", "sync_overhead", "text_envs", "remote"} <= set(listed)
    assert main(["bench", "--only", "latency,nope"]) == 2
    assert "unknown benchmarks ['nope']" in capsys.readouterr().err


def test_outside_a_checkout_aenvs_bench_says_where_the_suite_is(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "_checkout", lambda: None)  # an aenvs installed from its wheel
    assert main(["bench", "--list"]) == 2
    err = capsys.readouterr().err
    assert "not in the aenvs package" in err
    assert (
        "\n    git clone https://github.com/aenvs/aenvs && cd aenvs && make bench\n" in err
    )  # a command to paste


@pytest.mark.parametrize("name", ["latency", "throughput", "sync_overhead", "text_envs", "remote"])
def test_benchmark_scripts_live_beside_the_package(name: str) -> None:
    import importlib
    from pathlib import Path

    from benchmarks.harness import SUITE

    (benchmark,) = [b for b in SUITE if b.name == name]
    module = importlib.import_module(benchmark.module_name)
    assert module.__file__ is not None
    assert Path(module.__file__).parent == Path(__file__).resolve().parents[2] / "benchmarks"
    assert callable(getattr(module, benchmark.function))


def test_the_wheel_holds_the_library_only() -> None:
    """pyproject finds the packages under src/aenvs/ (whatever modules they hold), and only those:
    neither the benchmarks nor the tests nor the examples are in the wheel."""
    import tomllib
    from pathlib import Path

    from setuptools import find_packages

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = config["packages"]["find"]
    assert find["where"] == ["src"]
    packages = find_packages(str(root / "src"), include=find["include"])
    assert "aenvs" in packages and "aenvs.executors" in packages
    assert all(p == "aenvs" or p.startswith("aenvs.") for p in packages), packages


@pytest.mark.slow
def test_the_suites_benchmarks_follow_the_protocol(tmp_path) -> None:
    """Each benchmark of the suite, with arguments that make it short, gives rows its plots draw."""
    from benchmarks.harness import SUITE
    from benchmarks.harness.plots import draw

    tiny = {
        "latency": {"duration": 0.05, "warmup": 0.01},
        "throughput": {
            "duration": 0.05,
            "warmup": 0.01,
            "only": ["cartpole"],
            "sizes": [2],
            "skip_peers": ["torchrl", "envpool"],
        },
        "sync_overhead": {"num_envs": [2], "steps": 50, "repeats": 1, "skip_torchrl": True},
        "text_envs": {
            "num_envs": [2],
            "steps": 20,
            "repeats": 1,
            "executors": ["inline", "process"],
            "gymnasium_max_n": 2,
            "carry_n": 2,
            "async_n": 8,
        },
    }
    suite = [dataclasses.replace(b, quick=tiny[b.name]) for b in SUITE if b.name in tiny]
    assert len(suite) == len(tiny)
    for run in run_suite(suite, out_dir=tmp_path, quick=True, progress=False):
        log = (tmp_path / f"{run.benchmark.name}.log").read_text()
        assert run.ok, f"{run.benchmark.name}: {run.failed}\n{log}"
        drawn = 0
        for plot in run.benchmark.plots:  # each plot whose workload was measured draws
            if any(all(row.get(k) == v for k, v in plot.where.items()) for row in run.rows):
                assert draw(plot, run.rows, tmp_path / plot.file), (
                    run.benchmark.name,
                    plot.file,
                    run.rows[:2],
                )
                drawn += 1
        assert drawn, run.benchmark.name

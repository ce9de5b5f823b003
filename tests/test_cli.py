"""The ``aenvs`` command line's options: bad values refused while parsing, with messages in the
user's words, and help that says each default once."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from aenvs.cli import main


def parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error ``aenvs`` prints for ``argv``, which it must refuse as a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "abc"], "argument -s/--steps: invalid positive integer: 'abc'"),
        (["-n", "0"], "argument -n/--num-envs: invalid positive integer: '0'"),
        (["--max-concurrency", "1.5"], "argument --max-concurrency: invalid positive integer: '1.5'"),
        (["--step-timeout", "soon"], "argument --step-timeout: invalid number of seconds (> 0): 'soon'"),
        (["--rate-limit", "2:x"], "argument --rate-limit: expected PER_SECOND[:BURST] (e.g. 20 or 20:5)"),
    ],
)
def test_bad_values_are_refused_in_the_users_words(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = parse_error(capsys, "run", *argv)
    assert error.startswith(f"aenvs run: error: {message}"), error
    assert "_positive" not in error and "_rate_limit" not in error  # no private names


def test_a_bad_rate_limit_is_refused_before_the_pool_is_imported() -> None:
    """Parsing ``--rate-limit`` builds the RateLimit without importing the pool (nor torch),
    so a bad value is refused at once."""
    code = (
        "import sys\nfrom aenvs.cli import main\n"
        "try:\n    main(['run', '--rate-limit', '0:2'])\nexcept SystemExit as exc:\n    print(exc.code)\n"
        "print(sorted(m for m in ('aenvs._pool', 'torch', 'tensordict') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split("\n")[:2] == ["2", "[]"], result.stdout + result.stderr
    assert "per_second must be a finite number > 0, got 0.0" in result.stderr


def test_a_good_rate_limit_is_parsed_into_a_rate_limit() -> None:
    from aenvs import RateLimit
    from aenvs.cli import build_parser

    args = build_parser().parse_args(["run", "--rate-limit", "20:5"])
    assert isinstance(args.rate_limit, RateLimit)
    assert (args.rate_limit.per_second, args.rate_limit.burst) == (20.0, 5)


def test_the_executor_option_offers_every_executor(capsys: pytest.CaptureFixture[str]) -> None:
    error = parse_error(capsys, "run", "-e", "nope")
    assert "(choose from 'inline', 'thread', 'process', 'ray')" in error


def test_the_ray_executor_without_ray_says_what_to_install() -> None:
    code = (
        "import sys\nsys.modules['ray'] = None\nfrom aenvs.cli import main\n"
        "sys.exit(main(['run', '-e', 'ray', '--steps', '8', '--no-progress']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "aenvs run: error: the ray executor needs ray, which is not installed: pip install 'aenvs[ray]'"
    )


@pytest.mark.parametrize("command", ["run", "bench"])
def test_help_says_each_default_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options = re.split(r"\n  (?=-)", out.split("options:", 1)[1])
    assert len(options) > 5
    for option in options:
        assert len(re.findall(r"\(default", option)) <= 1, option
    assert "(default: None)" not in out and "(default: False)" not in out

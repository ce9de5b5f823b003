"""examples/external_env.py runs: simulators in subprocesses connect in, the trainer
collects from the server's pool, and every simulator stops cleanly when the trainer is done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "external_env.py"


def test_the_external_env_example_collects_and_its_simulators_stop() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--simulators", "2", "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "collected 3 episodes from 2 simulators" in result.stdout
    assert "simulators exited cleanly: 2/2" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr

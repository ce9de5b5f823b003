"""Smoke test of examples/legacy_sync_script.py (run as a script, as users do)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "legacy_sync_script.py"


def test_legacy_sync_script_runs_on_serial_and_parallel_envs() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--num-envs", "3", "--steps", "60"],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    serial, parallel = out.split("ParallelEnv(3, make_env):")
    assert "SerialEnv(3, make_env):" in serial
    for part in (serial, parallel):
        assert "dims [None, 'time']" in part
        assert "step_and_maybe_reset: 180 steps" in part
        assert "partial reset of envs [0, 2]: envs [1] kept their observation" in part

    # seeded the same way, both give the same numbers
    def numbers(part: str) -> list[str]:
        return [
            line
            for line in part.splitlines()
            if line.strip() and "done in" not in line and "make_env" not in line
        ]

    assert numbers(serial) == numbers(parallel)

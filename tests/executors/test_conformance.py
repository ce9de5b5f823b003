"""The public conformance kit (aenvs.testing.check_executor) over the four built-in executors.

Each runs the whole battery on both event loops. Every built-in executor declares
``abort`` and ``respawn``, so only two checks may be skipped: worker death where envs run
in the caller's process (no worker can die alone), and env code kept off the loop for
the inline executor, which declares ``blocks_loop``.
"""

from __future__ import annotations

import pytest

from aenvs.executors import make_executor
from aenvs.testing import check_executor

pytestmark = pytest.mark.timeout(180)

SKIPPED = {
    "inline": {"worker_death_is_a_crash", "env_code_runs_off_the_loop"},
    "thread": {"worker_death_is_a_crash"},
    "process": set(),
    "ray": set(),
}


async def test_builtin_executor_passes_the_conformance_kit(executor: str) -> None:
    report = await check_executor(lambda: make_executor(executor))
    assert set(report.skipped) == SKIPPED[executor], str(report)

"""examples/external_env.py runs: simulators in subprocesses connect in, the trainer
collects from the server's pool, and every simulator stops cleanly when the trainer is done;
and the guide's two-machine set-up (its certificate command, a token, TLS) runs on loopback."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "external_env.py"
GUIDE = ROOT / "docs" / "guide" / "external-envs.md"
RUN = 120  # seconds a process of these tests may take
# the guide's trainer command, on loopback, with a free port and fewer slots and episodes
TRAINER_ON_LOOPBACK = [
    *("--host", "127.0.0.1", "--port", "0", "--certfile", "cert.pem", "--keyfile", "key.pem"),
    *("--slots", "2", "--simulators", "0", "--episodes", "3"),
]


def test_the_external_env_example_collects_and_its_simulators_stop() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--simulators", "2", "--slots", "2", "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=RUN,
        check=True,
    )
    assert "collected 3 episodes in 2 env slots" in result.stdout
    assert "simulators exited cleanly: 2/2" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def guide_certificate_command() -> list[str]:
    """The guide's openssl command, for 127.0.0.1 instead of the trainer's name and address."""
    block = re.search(r"```bash\n(openssl req .*?)\n(?!    )", GUIDE.read_text(), re.DOTALL)
    assert block is not None, "the guide has no openssl command"
    command = shlex.split(block.group(1).replace("\\\n", " "))
    san = next(i for i, arg in enumerate(command) if arg.startswith("subjectAltName="))
    command[san] = "subjectAltName=IP:127.0.0.1"
    return command


def test_the_two_machine_set_up_of_the_guide_runs_on_loopback(tmp_path: Path) -> None:
    subprocess.run(guide_certificate_command(), cwd=tmp_path, capture_output=True, timeout=RUN, check=True)
    token = secrets.token_urlsafe(32)
    with_token = {**os.environ, "AENVS_SERVE_TOKEN": token}
    trainer = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *TRAINER_ON_LOOPBACK],
        cwd=tmp_path,
        env=with_token,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    simulators: list[subprocess.Popen[str]] = []
    try:
        assert trainer.stdout is not None
        serving = trainer.stdout.readline().split()
        assert serving[:1] == ["serving"] and serving[1].startswith("wss://127.0.0.1:"), serving
        simulate = [sys.executable, str(EXAMPLE), "--simulate", serving[1], "--cafile", "cert.pem"]
        without_token = {k: v for k, v in os.environ.items() if k != "AENVS_SERVE_TOKEN"}
        intruder = subprocess.run(
            simulate, cwd=tmp_path, env=without_token, capture_output=True, text=True, timeout=RUN
        )
        assert intruder.returncode != 0
        assert "refused this client (HTTP 401): this server requires a token" in intruder.stderr
        simulators += [
            subprocess.Popen(simulate, cwd=tmp_path, env=with_token, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        out, err = trainer.communicate(timeout=RUN)
        assert trainer.returncode == 0, err
        assert "collected 3 episodes in 2 env slots" in out
        for simulator in simulators:
            _, sim_err = simulator.communicate(timeout=RUN)
            assert simulator.returncode == 0 and "Traceback" not in sim_err, sim_err
    finally:
        for process in [trainer, *simulators]:
            process.kill()
            process.wait(RUN)

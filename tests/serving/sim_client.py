"""A simulator in a subprocess, for the tests that kill one: ``python sim_client.py URL``.

Starts one episode, sends its first observation, prints ``acting <episode_id> <action>``
once the trainer's action arrives, then hangs without answering (until it is killed).
"""

from __future__ import annotations

import sys
import threading

from aenvs import PolicyClient


def main(url: str) -> None:
    with PolicyClient(url) as client:
        episode_id = client.start_episode()
        action = client.get_action(episode_id, "sub0")
        print(f"acting {episode_id} {action}", flush=True)
        threading.Event().wait()  # killed here, mid-episode


if __name__ == "__main__":
    main(sys.argv[1])

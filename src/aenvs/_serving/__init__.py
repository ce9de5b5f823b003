"""Envs that connect in: a websocket server whose client episodes are the envs of a pool,
and the policy clients simulators use (RLlib's external env pattern).

Needs the ``serve`` extra (``websockets``); ``import aenvs`` never imports it.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("websockets") is None:  # pragma: no cover - the test extra installs it
    raise ImportError(
        "aenvs.serve and the policy clients need the websockets package: pip install 'aenvs[serve]'"
    )

from aenvs._serving.async_client import AsyncPolicyClient
from aenvs._serving.protocol import PolicyServerError
from aenvs._serving.server import EnvServer, serve
from aenvs._serving.sync_client import PolicyClient

__all__ = ["AsyncPolicyClient", "EnvServer", "PolicyClient", "PolicyServerError", "serve"]

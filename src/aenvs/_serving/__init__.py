"""Envs that connect in: a websocket server whose client episodes are the envs of a pool,
and the policy clients simulators use (RLlib's external env pattern).

Needs the ``serve`` extra (``websockets``); ``import aenvs`` never imports it.
"""

from __future__ import annotations

from aenvs._optional import require

# before the modules that import websockets: without it, say which extra installs it
require("websockets", extra="serve", feature="aenvs.serve and the policy clients")

from aenvs._serving.async_client import AsyncPolicyClient  # noqa: E402
from aenvs._serving.protocol import PolicyServerError  # noqa: E402
from aenvs._serving.server import EnvServer, serve  # noqa: E402
from aenvs._serving.sync_client import PolicyClient  # noqa: E402

__all__ = ["AsyncPolicyClient", "EnvServer", "PolicyClient", "PolicyServerError", "serve"]

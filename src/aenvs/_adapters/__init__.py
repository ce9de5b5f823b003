"""Env adapters: how gymnasium envs, native :class:`aenvs.Env` s and TorchRL envs run as pool members.

Adapters run inside workers (threads, processes, Ray actors) and on the event loop; they
turn an env's results into the runner's :class:`Outcome` and never import the pool.
"""

from aenvs._adapters.building import build_env, env_kind, first_use, make_adapter, warm
from aenvs._adapters.outcome import Outcome

__all__ = ["Outcome", "build_env", "env_kind", "first_use", "make_adapter", "warm"]

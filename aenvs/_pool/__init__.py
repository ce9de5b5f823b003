"""The pool: :class:`AsyncEnvPool` and the parts it is made of.

- ``core``: the pool itself: lifecycle, sending, receiving, whole-batch calls, calls on envs.
- ``receives``: receives waiting at the same time, served fairly.
- ``restarts``: the restart supervisor (``on_error="restart"``).
- ``masked``: TorchRL's partial steps and resets (``"_step"`` / ``"_reset"``).
- ``rollout``: random actions and rollouts, over the pool's public methods.
- ``stats``: :class:`PoolStats`.
"""

from aenvs._pool.core import AsyncEnvPool, EnvIndex, StackMode
from aenvs._pool.stats import PoolStats

__all__ = ["AsyncEnvPool", "EnvIndex", "PoolStats", "StackMode"]

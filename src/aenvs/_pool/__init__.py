"""The pool: :class:`AsyncEnvPool` and the parts it is made of.

- ``core``: the pool itself: lifecycle, its documented methods, which hand the work to:
- ``parts``: the working parts wired together: ``slots`` (the per-env slot table),
  ``sending`` (env indices, dispatch, timeouts armed), ``receiving`` (results and call
  answers), ``failures`` (timeouts, non-finite results), ``abandoned`` (whole-batch
  commands whose caller gave up), ``restarts`` (the restart supervisor).
- ``fair_receives``: receives waiting at the same time, served fairly.
- ``limits``: ``max_concurrency`` and :class:`~aenvs.RateLimit`: commands held until they may run.
- ``deadlines``: ``episode_timeout``, and timeouts that end an episode as truncated (``on_timeout``).
- ``latency``: windows of recent latencies and their percentiles, for :class:`PoolStats`.
- ``masked``: the whole-batch calls, with TorchRL's partial steps and resets (``"_step"`` / ``"_reset"``).
- ``rollout``: random actions and rollouts, over the pool's public methods.
- ``arguments``: the pool's construction arguments, read and checked (``PoolOptions``).
- ``stats``: :class:`PoolStats`.
"""

from aenvs._pool.core import AsyncEnvPool, EnvIndex, StackMode
from aenvs._pool.deadlines import OnTimeout
from aenvs._pool.stats import PoolStats
from aenvs._rate_limit import RateLimit

__all__ = ["AsyncEnvPool", "EnvIndex", "OnTimeout", "PoolStats", "RateLimit", "StackMode"]

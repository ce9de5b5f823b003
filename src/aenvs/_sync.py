"""The synchronous shim: TorchRL's ``SerialEnv`` / ``ParallelEnv`` API on the async core.

Each method runs the matching coroutine of :class:`~aenvs.AsyncEnvPool` on a loop
driver (:mod:`aenvs._loop`) and returns its result; the shim itself holds no env
logic. Partial steps and resets (``"_step"`` / ``"_reset"`` masks), seeding, rollouts
and random actions are the pool's.

Example:
    >>> import gymnasium
    >>> from aenvs import SerialEnv
    >>> with SerialEnv(4, lambda: gymnasium.make("CartPole-v1")) as env:
    ...     next_seed = env.set_seed(0)
    ...     traj = env.rollout(100, break_when_any_done=False)
    >>> traj.batch_size, traj.names
    (torch.Size([4, 100]), [None, 'time'])
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self

import torch
from tensordict import TensorDictBase

from aenvs._env import EnvFn, EnvState
from aenvs._errors import EnvError, PoolClosedError
from aenvs._loop import DriverKind, LoopDriver, kill_dropped, make_driver
from aenvs._pool import AsyncEnvPool, EnvIndex, OnTimeout, PoolStats, RateLimit, StackMode
from aenvs._specs import EnvSpec, Space
from aenvs._torchrl_args import check_options, env_factories
from aenvs.executors import Executor

__all__ = ["BatchedEnv", "ParallelEnv", "SerialEnv"]


def _call_back(
    env: BatchedEnv,
    callback: Callable[[BatchedEnv, TensorDictBase], Any],
    _pool: AsyncEnvPool,
    td: TensorDictBase,
) -> Any:
    """A rollout callback of the shim, called by the pool: it gets the shim, not the pool."""
    return callback(env, td)


class BatchedEnv:
    """The shared surface of :class:`SerialEnv` and :class:`ParallelEnv`.

    Args:
        num_workers: number of envs (TorchRL's name: one env per "worker").
        create_env_fn: a factory (or a list of ``num_workers`` factories) returning a
            gymnasium env or an :class:`aenvs.Env`, or a gymnasium id.
        create_env_kwargs: keyword arguments for the factories: one dict, or one per env.
        executor: where the envs run (default: the class's, ``"inline"`` / ``"process"``).
        stack: ``"auto"`` / ``"dense"`` / ``"lazy"``, as for :class:`~aenvs.AsyncEnvPool`.
        envs_per_worker: envs hosted by one thread or process of the executor.
        seed: seeds the envs' first reset (TorchRL's seed chain).
        loop: ``"auto"`` (a private loop in this thread, or a background loop thread
            when this thread already runs an event loop), ``"private"`` or ``"portal"``.
        loop_factory: makes the private loop (default: uvloop's where installed).
        device: only ``None`` / ``"cpu"``; other TorchRL batched-env arguments
            (``shared_memory``, ``mp_start_method``...) are accepted and ignored.
        on_error: ``"raise"`` or ``"restart"``; with ``max_restarts`` and ``restart_backoff``,
            what an env's failure does, as for :class:`~aenvs.AsyncEnvPool`.
        max_restarts: restarts allowed per env (``on_error="restart"``).
        restart_backoff: seconds before an env's first restart, doubled for each next one.
        step_timeout: seconds a step may take (see the pool's ``on_timeout``).
        reset_timeout: seconds a reset may take.
        episode_timeout: seconds an episode may last (see the guide's "Deadlines" page).
        on_timeout: ``"raise"`` or ``"truncate"`` (steps then carry ``("next", "timed_out")``).
        startup_timeout: seconds the executor may take to build every env.
        close_timeout: seconds :meth:`close` waits for workers to stop before killing them.
        check_finite: make a result with NaN or inf, or a text observation outside its
            ``Text`` space, an EnvError for its env.
        max_concurrency: at most this many envs run a reset or step at once.
        rate_limit: a :class:`~aenvs.RateLimit` each env's reset or step takes a token from.
        copy_results: False: a whole-batch step's entries under ``"next"`` are views of the
            pool's buffers, overwritten by the next step (see the pool's ``copy_results``).

    Not thread-safe: call one env from one thread at a time.
    """

    default_executor: ClassVar[str] = "inline"

    def __init__(
        self,
        num_workers: int,
        create_env_fn: EnvFn | Sequence[EnvFn],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        executor: str | Executor | None = None,
        stack: StackMode = "auto",
        envs_per_worker: int | None = None,
        seed: int | None = None,
        loop: DriverKind = "auto",
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        device: str | torch.device | None = None,
        on_error: Literal["raise", "restart"] = "raise",
        max_restarts: int = 3,
        restart_backoff: float = 0.1,
        step_timeout: float | None = None,
        reset_timeout: float | None = None,
        episode_timeout: float | None = None,
        on_timeout: OnTimeout = "raise",
        startup_timeout: float | None = None,
        close_timeout: float | None = None,
        check_finite: bool = False,
        max_concurrency: int | None = None,
        rate_limit: RateLimit | None = None,
        copy_results: bool = True,
        **torchrl_options: Any,
    ) -> None:
        check_options(type(self).__name__, torchrl_options, device)
        env_fns, make_kwargs = env_factories(num_workers, create_env_fn, create_env_kwargs)
        self._pool = AsyncEnvPool(
            env_fns,
            executor=executor or self.default_executor,
            stack=stack,
            envs_per_worker=envs_per_worker,
            seed=seed,
            make_kwargs=make_kwargs,
            on_error=on_error,
            max_restarts=max_restarts,
            restart_backoff=restart_backoff,
            step_timeout=step_timeout,
            reset_timeout=reset_timeout,
            episode_timeout=episode_timeout,
            on_timeout=on_timeout,
            startup_timeout=startup_timeout,
            close_timeout=close_timeout,
            check_finite=check_finite,
            max_concurrency=max_concurrency,
            rate_limit=rate_limit,
            copy_results=copy_results,
        )
        self._driver: LoopDriver = make_driver(
            loop, loop_factory=loop_factory, wait_outside=self._pool.executor.wait_outside_loop
        )
        try:
            self._driver.run(self._pool.start)
        except BaseException:
            self._driver.close()
            raise

    def _run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if self._driver.closed:
            raise PoolClosedError("this env is closed")
        if self._pool.has_abandoned:  # a call was interrupted: free its envs first
            self._driver.run(self._pool.drop_abandoned)
        return self._driver.run(fn, *args, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self, *, raise_if_closed: bool = False) -> None:
        """Stop every worker and the loop driver. Idempotent (unless ``raise_if_closed``)."""
        if self._driver.closed:
            if raise_if_closed:
                raise PoolClosedError("this env is closed")
            return
        try:
            self._driver.run(self._pool.aclose)
        finally:
            self._driver.close()

    @property
    def is_closed(self) -> bool:
        return self._pool.is_closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        kill_dropped(self, self.__dict__.get("_pool"), self.__dict__.get("_driver"))

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else "running"
        return (
            f"{type(self).__name__}(num_workers={self.num_workers}, "
            f"executor={self._pool.executor.name!r}, {state})"
        )

    def __len__(self) -> int:
        return self._pool.num_envs

    # -- properties -----------------------------------------------------------------------

    @property
    def pool(self) -> AsyncEnvPool:
        """The async pool underneath (bound to this env's loop: use it through this env)."""
        return self._pool

    @property
    def loop_driver(self) -> LoopDriver:
        return self._driver

    @property
    def num_workers(self) -> int:
        """Number of envs (TorchRL's name)."""
        return self._pool.num_envs

    @property
    def num_envs(self) -> int:
        return self._pool.num_envs

    @property
    def batch_size(self) -> torch.Size:
        return self._pool.batch_size

    @property
    def env_specs(self) -> list[EnvSpec]:
        """Per env: its observation, action and reward spaces (and the entries they lay out)."""
        return self._pool.env_specs

    @property
    def observation_spaces(self) -> list[Space]:
        return [s.observation_space for s in self.env_specs]

    @property
    def action_spaces(self) -> list[Space]:
        return [s.action_space for s in self.env_specs]

    @property
    def observation_space(self) -> Space:
        """The observation space every env shares (ValueError if they differ: see ``observation_spaces``)."""
        return self._shared("observation_space")

    @property
    def action_space(self) -> Space:
        """The action space every env shares (ValueError if they differ: see ``action_spaces``)."""
        return self._shared("action_space")

    def _shared(self, name: str) -> Space:
        values = [getattr(s, name) for s in self.env_specs]
        if any(v != values[0] for v in values[1:]):
            raise ValueError(f"the envs have different {name}s; use {name}s for one per env")
        return values[0]

    @property
    def env_states(self) -> list[EnvState]:
        return self._pool.env_states

    def stats(self) -> PoolStats:
        """The pool's counters: per env step counts and latencies, in-flight envs, throughput.

        Example:
            >>> with SerialEnv(2, "CartPole-v1") as env:
            ...     _ = env.rand_step(env.reset())
            ...     env.stats().steps
            [1, 1]
        """
        return self._pool.stats()

    # -- TorchRL's batched-env API ------------------------------------------------------------

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Reset the envs; with ``"_reset"`` entries in ``tensordict``, only those envs (or groups).

        ``kwargs``: ``env_index``, ``seed``, ``options`` of :meth:`AsyncEnvPool.reset`.

        Example:
            >>> with SerialEnv(2, "CartPole-v1") as env:
            ...     td = env.reset()
            ...     td["_reset"] = torch.tensor([[True], [False]])
            ...     out = env.reset(td)  # env 0 is reset, env 1 keeps its values
            >>> torch.equal(out["observation"][1], td["observation"][1])
            True
        """
        return self._run(self._pool.reset, tensordict, **kwargs)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step the envs (with a ``"_step"`` entry, only those marked).

        Returns the input at the root with the results under ``"next"``; as in TorchRL,
        ``"next"`` is also written into ``tensordict``.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     td = env.step(env.rand_action(env.reset()))
            >>> td["next", "reward"].shape
            torch.Size([4, 1])
        """
        out = self._run(self._pool.step, tensordict)
        if out.batch_size == tensordict.batch_size and out is not tensordict:
            tensordict.set("next", out.get("next"))
        return out

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, and reset the envs whose episode ended: ``(out, next_td)``.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     td = env.reset()
            ...     for _ in range(100):  # the envs whose episode ended are reset in td
            ...         out, td = env.step_and_maybe_reset(env.rand_action(td))
            >>> "next" in out.keys(), "next" in td.keys()
            (True, False)
        """
        return self._run(self._pool.step_and_maybe_reset, tensordict)

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Random actions (torch's RNG) written into ``tensordict`` (returned), or a new TensorDict."""
        return self._pool.rand_action(tensordict)

    def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """:meth:`step` with random actions."""
        return self.step(self.rand_action(tensordict))

    def rollout(
        self,
        max_steps: int,
        policy: Callable[[TensorDictBase], TensorDictBase | None] | None = None,
        callback: Callable[[BatchedEnv, TensorDictBase], Any] | None = None,
        *,
        auto_reset: bool = True,
        break_when_any_done: bool | None = None,
        break_when_all_done: bool | None = None,
        return_contiguous: bool = True,
        tensordict: TensorDictBase | None = None,
    ) -> TensorDictBase:
        """TorchRL's rollout: a ``[num_envs, T]`` trajectory, the last dim named ``"time"``.

        See :meth:`AsyncEnvPool.rollout`. ``policy`` and ``callback`` run on the loop: they
        must not call this env.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     traj = env.rollout(100, policy=lambda td: td.set("action", torch.ones(4).long()))
            >>> traj.names
            [None, 'time']
        """
        pool_callback = None if callback is None else functools.partial(_call_back, self, callback)
        return self._run(
            self._pool.rollout,
            max_steps,
            policy,
            pool_callback,
            auto_reset=auto_reset,
            break_when_any_done=break_when_any_done,
            break_when_all_done=break_when_all_done,
            return_contiguous=return_contiguous,
            tensordict=tensordict,
        )

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed env ``k`` with the ``k``-th seed of TorchRL's chain from ``seed``; return the next seed.

        Each env is reset with its seed at once, as TorchRL's ``GymEnv.set_seed`` does.

        Example:
            >>> with SerialEnv(2, "CartPole-v1") as env:
            ...     next_seed = env.set_seed(0)  # env 0 gets seed 0, env 1 the chain's next one
            ...     obs = env.reset()["observation"]
            ...     env.set_seed(0) == next_seed and torch.equal(env.reset()["observation"], obs)
            True
        """
        if seed is None:
            return None
        if static_seed:
            raise NotImplementedError("static_seed=True is not supported: each env gets its own seed")
        return self._run(self._pool.set_seed, seed)

    # -- split-phase calls (TorchRL's AsyncEnvPool API, not awaitable) -------------------------

    def async_step_send(self, tensordict: TensorDictBase, env_index: EnvIndex | None = None) -> None:
        """Dispatch a step to the envs of ``tensordict`` (its ``"env_index"``, ``env_index``, or all)."""
        self._run(self._pool.async_step_send, tensordict, env_index)

    def async_step_recv(
        self,
        min_get: int | None = None,
        env_index: EnvIndex | None = None,
        *,
        max_get: int | None = None,
        timeout: float | None = None,
    ) -> TensorDictBase:
        """Collect finished steps: at least ``min_get`` (default 1), at most ``max_get``.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     env.async_step_send(env.rand_action(env.reset()))
            ...     out = env.async_step_recv(min_get=2)
            >>> len(out) >= 2
            True
        """
        return self._run(self._pool.async_step_recv, min_get, max_get, env_index=env_index, timeout=timeout)

    def async_step_and_maybe_reset_send(
        self, tensordict: TensorDictBase, env_index: EnvIndex | None = None
    ) -> None:
        """Like :meth:`async_step_send`; envs whose episode ends are reset in the same round trip."""
        self._run(self._pool.async_step_and_maybe_reset_send, tensordict, env_index)

    def async_step_and_maybe_reset_recv(
        self,
        min_get: int | None = None,
        env_index: EnvIndex | None = None,
        *,
        max_get: int | None = None,
        timeout: float | None = None,
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Collect finished step-and-resets: ``(out, next_td)`` as :meth:`step_and_maybe_reset`,
        with the same rules as :meth:`async_step_recv`.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     env.async_step_and_maybe_reset_send(env.rand_action(env.reset()))
            ...     out, td = env.async_step_and_maybe_reset_recv(min_get=4)
            >>> out["next", "reward"].shape, "next" in td.keys()
            (torch.Size([4, 1]), False)
        """
        return self._run(
            self._pool.async_step_and_maybe_reset_recv, min_get, max_get, env_index=env_index, timeout=timeout
        )

    def async_reset_send(
        self,
        tensordict: TensorDictBase | None = None,
        env_index: EnvIndex | None = None,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Dispatch a reset to some envs (``env_index``, ``tensordict["env_index"]`` or all)."""
        self._run(self._pool.async_reset_send, tensordict, env_index=env_index, seed=seed, options=options)

    def async_reset_recv(
        self,
        min_get: int | None = None,
        env_index: EnvIndex | None = None,
        *,
        max_get: int | None = None,
        timeout: float | None = None,
    ) -> TensorDictBase:
        """Collect finished resets, with the same rules as :meth:`async_step_recv`."""
        return self._run(self._pool.async_reset_recv, min_get, max_get, env_index=env_index, timeout=timeout)

    # -- the envs' own attributes ------------------------------------------------------------

    def call(self, name: str, *args: Any, env_index: EnvIndex | None = None, **kwargs: Any) -> list[Any]:
        """Call method ``name`` of each env (default all); one return value per env."""
        return self._run(self._pool.call, name, *args, env_index=env_index, **kwargs)

    def get_attr(self, name: str, *, env_index: EnvIndex | None = None) -> list[Any]:
        """Attribute ``name`` of each env (default all)."""
        return self._run(self._pool.get_attr, name, env_index=env_index)

    def set_attr(self, name: str, value: Any, *, env_index: EnvIndex | None = None) -> None:
        """Set attribute ``name`` of each env (default all)."""
        self._run(self._pool.set_attr, name, value, env_index=env_index)

    def __getattr__(self, name: str) -> Any:
        """Forward to the envs: ``env.g`` is ``[g of env 0, g of env 1, ...]``; ``env.f(x)`` calls
        ``f(x)`` on every env and returns the list of results.

        Example:
            >>> with SerialEnv(4, "CartPole-v1") as env:
            ...     env.gravity
            [9.8, 9.8, 9.8, 9.8]
        """
        if name.startswith("_") or "_pool" not in self.__dict__ or self._pool.is_closed:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            values = self.get_attr(name)
        except EnvError as err:
            if err.exc_type == "builtins.AttributeError" and "pickle" not in err.remote_traceback:
                raise AttributeError(
                    f"{type(self).__name__} has no attribute {name!r}, nor has env {err.env_index}"
                ) from None
            if "pickl" in err.remote_traceback:  # a method of an env that cannot travel: call it there
                return functools.partial(self.call, name)
            raise
        if values and all(callable(v) for v in values):
            return functools.partial(self.call, name)
        return values


class SerialEnv(BatchedEnv):
    """``num_workers`` envs stepped one after the other in this process (executor ``"inline"``).

    TorchRL's ``SerialEnv`` API (arguments, ``reset`` / ``step`` / ``rollout`` /
    ``step_and_maybe_reset`` / ``set_seed``, ``"_step"`` / ``"_reset"`` masks, attribute
    forwarding) on an :class:`~aenvs.AsyncEnvPool`; ``executor=`` picks another executor.

    Example:
        >>> import gymnasium
        >>> from aenvs import SerialEnv
        >>> env = SerialEnv(4, lambda: gymnasium.make("CartPole-v1"))
        >>> td = env.rand_step(env.reset())
        >>> td["next", "observation"].shape
        torch.Size([4, 4])
        >>> env.close()
    """

    default_executor = "inline"


class ParallelEnv(BatchedEnv):
    """``num_workers`` envs in worker processes (executor ``"process"``), results in shared memory.

    Same API as :class:`SerialEnv`. Scripts need no ``__main__`` guard: workers fork from aenvs's zygote.

    Example:
        >>> import gymnasium
        >>> from aenvs import ParallelEnv
        >>> with ParallelEnv(4, lambda: gymnasium.make("CartPole-v1")) as env:
        ...     traj = env.rollout(100, break_when_any_done=False)
        >>> traj.batch_size
        torch.Size([4, 100])
    """

    default_executor = "process"

"""gymnasium's vector API on an :class:`~aenvs.AsyncEnvPool`: :class:`AsyncVectorEnv`.

A real ``gymnasium.vector.VectorEnv``: numpy in and out, batched spaces, the three
autoreset modes, ``reset_mask`` partial resets, ``call`` / ``get_attr`` / ``set_attr``
and vector infos (a dict of arrays with ``_key`` masks), step for step equal to
``gymnasium.vector.SyncVectorEnv`` under the same seeds, on any aenvs executor.

How it stays exact and cheap: each env is wrapped in :class:`~aenvs._adapters.autoreset.Member`, which applies
the autoreset mode inside the worker (as gymnasium's own ``AsyncVectorEnv`` worker
does), so a vector step is one pool step, one round trip. Values the pool's layout
would change (a reward float32 cannot hold, info dicts, which the pool turns into
tensors) travel beside it untouched, and only on the steps that have them.

This module imports no torch at import time (the pool loads it when an env is built).
:class:`AsyncVectorEnv` and its methods show runnable examples.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from aenvs._adapters.autoreset import build_member, make_from_id
from aenvs._env import EnvFn
from aenvs._errors import EnvError, VectorEnvTimeoutError
from aenvs._loop import kill_dropped
from aenvs._vector.arguments import reset_targets
from aenvs._vector.collecting import free_others, receive_all, receive_all_columns
from aenvs._vector.conversion import NotABatch, action_writer
from aenvs._vector.results import Results
from aenvs._vector.spaces import vector_spaces

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from aenvs._loop import DriverKind, LoopDriver
    from aenvs._pool import AsyncEnvPool
    from aenvs.executors import Executor

__all__ = ["AsyncVectorEnv"]


class AsyncVectorEnv(VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose envs run on an aenvs executor.

    Drop-in for ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv``: the same
    results, step for step, under the same seeds (actions are cast to the action
    space's dtype first).

    Args:
        env_fns: zero-argument callables returning gymnasium envs (or gymnasium ids, or
            callables taking an :class:`~aenvs.EnvContext`).
        shared_memory: accepted for gymnasium's signature, no effect: the process executor
            always keeps fixed-shape entries in shared memory and sends the rest pickled.
        copy: return copies of the observations (the internal ones stay untouched for
            ``reset_mask`` resets), as gymnasium does.
        context: gymnasium's multiprocessing start method; accepted, no effect (the process
            executor forks its workers from a server of its own).
        daemon: accepted, no effect (aenvs's workers never outlive the vector env).
        worker: gymnasium's custom worker function: not supported (``ValueError`` unless None).
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space,
            single_observation_space)``, as gymnasium's.
        autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED``, with
            gymnasium's semantics (https://farama.org/Vector-Autoreset-Mode).
        executor: ``"inline"``, ``"thread"``, ``"process"`` (default) or an
            :class:`~aenvs.executors.Executor`.
        envs_per_worker: how many envs each worker hosts (default: the executor's choice).
        num_workers: how many workers the executor starts (default: the executor's choice).
        loop: the loop driver (``"auto"``, ``"private"``, ``"portal"``), as for
            :class:`~aenvs.SerialEnv`.
        **pool_options: further :class:`~aenvs.AsyncEnvPool` options (``on_error``, ``step_timeout``,
            ``max_concurrency``, ``rate_limit``...); not ``episode_timeout`` / ``on_timeout="truncate"``.

    Errors inside an env surface as :class:`~aenvs.EnvError`. Every gymnasium space works:
    one without a fixed shape (Text, Sequence, Graph, OneOf, custom) batches as a tuple of
    each env's value, as gymnasium's. Envs whose ``step`` / ``reset`` are ``async def`` are
    awaited (see :func:`aenvs._adapters.gym_async.lifted` for the wrappers around them).

    Example:
        >>> import gymnasium as gym
        >>> from aenvs.gymnasium import AsyncVectorEnv
        >>> envs = AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8, executor="thread")
        >>> obs, infos = envs.reset(seed=0)
        >>> envs.step_async(envs.action_space.sample())
        >>> obs, rewards, terminations, truncations, infos = envs.step_wait()
        >>> obs.shape, obs.dtype, rewards.dtype
        ((8, 4), dtype('float32'), dtype('float64'))
        >>> envs.close()
    """

    single_observation_space: spaces.Space[Any]
    observation_space: spaces.Space[Any]
    single_action_space: spaces.Space[Any]
    action_space: spaces.Space[Any]

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Any = None,
        observation_mode: str | tuple[spaces.Space[Any], spaces.Space[Any]] = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        *,
        executor: str | Executor = "process",
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        loop: DriverKind = "auto",
        **pool_options: Any,
    ) -> None:
        from aenvs._loop import make_driver
        from aenvs._pool import AsyncEnvPool

        self.env_fns = list(env_fns)
        if not self.env_fns:
            raise ValueError("AsyncVectorEnv needs at least one env")
        if worker is not None:  # gymnasium's custom worker function: there is nowhere to run it
            raise ValueError("AsyncVectorEnv(worker=...) is not supported: aenvs runs its own workers")
        if pool_options.get("episode_timeout") is not None or pool_options.get("on_timeout") == "truncate":
            raise ValueError(  # the envs reset themselves (autoreset): the pool sees no episode begin
                "AsyncVectorEnv takes no episode_timeout nor on_timeout='truncate': its envs' autoresets "
                "happen inside the workers, unseen by the pool's deadlines; step_timeout raises"
            )
        self.shared_memory, self.context, self.daemon = shared_memory, context, daemon
        self.copy, self.observation_mode = copy, observation_mode
        self.autoreset_mode = (
            autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        )
        self.num_envs = len(self.env_fns)
        self._state = AsyncState.DEFAULT
        members = [
            functools.partial(build_member, env_fn=fn, autoreset_mode=self.autoreset_mode)
            for fn in self.env_fns
        ]
        self._pool: AsyncEnvPool = AsyncEnvPool(
            members,
            executor=executor,
            stack="auto",  # differing envs are refused below, with gymnasium's messages
            envs_per_worker=envs_per_worker,
            num_workers=num_workers,
            **pool_options,
        )
        self._driver: LoopDriver = make_driver(loop, wait_outside=self._pool.executor.wait_outside_loop)
        try:
            self._driver.run(self._pool.start)
            self._setup_spaces()
        except BaseException:
            self._close_pool()
            raise
        self._all = list(range(self.num_envs))
        from torch import Tensor  # loaded with the pool's envs

        self._tensor_type = Tensor
        spec = self._pool.env_specs[0]
        # a dense pool of one-env members: steps can come back as columns, without a TensorDict
        columns = (
            [leaf.key for leaf in spec.step_leaves] if self._pool.is_dense and not spec.batch_shape else []
        )
        self._results = Results(self.single_observation_space, self.num_envs, self._add_info, columns)
        self._sent_rows: list[int] | None = None
        self._received: TensorDictBase | None = None

    def _setup_spaces(self) -> None:
        (
            self.single_observation_space,
            self.observation_space,
            self.single_action_space,
            self.action_space,
        ) = vector_spaces(self._pool.env_specs, self.observation_mode, type(self).__name__)
        self._write_actions = action_writer(self.single_action_space, ("action",), self.num_envs)
        metadata, render_mode = self._driver.run(self._first_env_attrs)
        self.metadata = dict(metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = render_mode

    async def _first_env_attrs(self) -> tuple[dict[str, Any], str | None]:
        (metadata,) = await self._pool.get_attr("metadata", env_index=[0])
        (render_mode,) = await self._pool.get_attr("render_mode", env_index=[0])
        return metadata, render_mode

    @classmethod
    def from_id(
        cls,
        id: str,
        num_envs: int = 1,
        *,
        executor: str | Executor = "process",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]] | None = None,
        vector_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncVectorEnv:
        """Build ``num_envs`` envs of a registered id, as ``gymnasium.make_vec`` does.

        Args:
            id: a gymnasium id (``"module:Env-v0"`` works too).
            num_envs: how many envs.
            executor: as for :class:`AsyncVectorEnv`.
            autoreset_mode: as for :class:`AsyncVectorEnv`.
            wrappers: applied to each env, innermost first.
            vector_kwargs: further :class:`AsyncVectorEnv` arguments.
            **kwargs: for ``gymnasium.make`` of each env.

        Example:
            >>> envs = AsyncVectorEnv.from_id("Pendulum-v1", num_envs=4, executor="thread", g=9.81)
            >>> envs
            AsyncVectorEnv(Pendulum-v1, num_envs=4)
            >>> envs.close()
        """
        spec = copy.deepcopy(gym.spec(id))
        make_kwargs = {**spec.kwargs, **kwargs}
        factory = functools.partial(make_from_id, id, dict(kwargs), list(wrappers or ()))
        vector = dict(vector_kwargs or {})
        env = cls([factory] * num_envs, executor=executor, autoreset_mode=autoreset_mode, **vector)
        spec.kwargs = make_kwargs
        if num_envs != 1:
            spec.kwargs["num_envs"] = num_envs
        env.spec = spec
        return env

    # -- lifecycle --------------------------------------------------------------------------

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _assert_idle(self, call: str) -> None:
        self._assert_is_running()
        if self._state is not AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `{call}` while waiting for a pending call to `{self._state.value}` to complete.",
                str(self._state.value),
            )

    def close_extras(self, **kwargs: Any) -> None:
        """Stop every worker of the pool and the loop driver.

        A reset or step still to be collected is dropped, with gymnasium's warning.
        """
        if self._state is not AsyncState.DEFAULT:
            gym.logger.warn(
                f"Calling `close` while waiting for a pending call to `{self._state.value}` to complete."
            )
        self._close_pool()

    def _close_pool(self) -> None:
        driver, pool = self.__dict__.get("_driver"), self.__dict__.get("_pool")
        if driver is None or driver.closed:
            if pool is not None:
                pool.executor.kill()
            return
        try:
            if pool is not None:
                driver.run(pool.aclose)
        finally:
            driver.close()

    def __del__(self) -> None:
        self.closed = True
        kill_dropped(self, self.__dict__.get("_pool"), self.__dict__.get("_driver"))

    @property
    def pool(self) -> AsyncEnvPool:
        """The :class:`~aenvs.AsyncEnvPool` underneath (bound to this env's loop driver)."""
        return self._pool

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """The ``np_random_seed`` of each env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """The ``np_random`` generator of each env."""
        return self.get_attr("np_random")

    # -- reset ------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those of ``options["reset_mask"]``); return observations and infos.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one seed per env.
            options: passed to each env's reset; a ``"reset_mask"`` entry (bool array of
                shape ``(num_envs,)``) resets only those envs, the others keep their
                observations.

        Example:
            >>> envs = AsyncVectorEnv.from_id("CartPole-v1", num_envs=4, executor="inline")
            >>> obs, infos = envs.reset(seed=0)
            >>> obs, infos = envs.reset(options={"reset_mask": np.array([True, False, True, False])})
            >>> envs.close()
        """
        self._assert_idle("reset")
        command = reset_targets(seed, options, self._all)
        return self._finish_reset(self._driver.run(self._reset, *command))

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send the resets of :meth:`reset`; :meth:`reset_wait` collects them."""
        self._assert_idle("reset_async")
        self._driver.run(self._send_reset, *reset_targets(seed, options, self._all))

    async def _send_reset(
        self, rows: list[int], seeds: list[int | None], options: dict[str, Any] | None
    ) -> None:
        await self._pool.async_reset_send(env_index=rows, seed=seeds, options=options)
        self._sent_rows = rows
        self._received = None
        self._state = AsyncState.WAITING_RESET

    async def _reset(
        self, rows: list[int], seeds: list[int | None], options: dict[str, Any] | None
    ) -> TensorDictBase:
        await self._send_reset(rows, seeds, options)
        return await self._collect(self._pool.async_reset_recv, rows, None)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Collect the resets sent by :meth:`reset_async`.

        Raises:
            NoAsyncCallError: no reset was sent.
            VectorEnvTimeoutError: ``timeout`` seconds passed first (the resets stay
                collectable); a ``multiprocessing.TimeoutError``, as gymnasium's.
        """
        self._assert_is_running()
        if self._state is not AsyncState.WAITING_RESET:
            raise NoAsyncCallError("Calling `reset_wait` without any prior call to `reset_async`.", "reset")
        assert self._sent_rows is not None
        return self._finish_reset(
            self._wait("reset_wait", self._pool.async_reset_recv, self._sent_rows, timeout)
        )

    def _wait(
        self, call: str, recv: Callable[..., Any], rows: list[int], timeout: float | None
    ) -> TensorDictBase:
        """Collect the results of ``rows`` for ``call``, raising gymnasium's timeout error."""
        try:
            return self._driver.run(self._collect, recv, rows, timeout)
        except TimeoutError:
            if timeout is None:
                raise
            late = self._driver.run(self._unanswered, rows)
        raise VectorEnvTimeoutError(call, timeout, late, self.num_envs)

    async def _unanswered(self, rows: list[int]) -> list[int]:
        """The envs of ``rows`` whose result has not arrived."""
        in_flight = set(self._pool.stats().in_flight_envs)
        return [i for i in rows if i in in_flight]

    def _finish_reset(self, td: TensorDictBase) -> tuple[Any, dict[str, Any]]:
        self._state = AsyncState.DEFAULT
        assert self._sent_rows is not None
        return self._results.reset(td, self._sent_rows, self.copy)

    async def _collect(
        self, recv: Callable[..., Any], rows: list[int], timeout: float | None
    ) -> TensorDictBase:
        """Receive the results of ``rows`` (on an env's error, the others first).

        Kept across an interrupted call (Ctrl-C, timeout): calling the ``*_wait`` method
        again carries on, as the results stay ready in the pool.
        """
        if self._received is not None:
            return self._received
        try:
            self._received = await receive_all(recv, rows, timeout)
        except EnvError:
            self._state = AsyncState.DEFAULT
            raise
        return self._received

    # -- step -------------------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (autoresetting as ``autoreset_mode`` says); numpy in and out.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``: rewards float64,
            terminations and truncations bool, all of shape ``(num_envs,)``.

        Example:
            >>> envs = AsyncVectorEnv.from_id("CartPole-v1", num_envs=4, executor="inline")
            >>> obs, infos = envs.reset(seed=0)
            >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
            >>> envs.close()
        """
        source = self._prepare_actions("step", actions)
        if self._results.reads_columns and all(type(v) is self._tensor_type for v in source.values()):
            # the common case, without building a TensorDict either way
            columns = self._driver.run(self._step_columns, source)
            self._state = AsyncState.DEFAULT
            return self._results.step_columns(columns, self.copy)
        td = self._driver.run(self._step, self._as_input(source))
        self._state = AsyncState.DEFAULT
        return self._results.step(td, self.copy)

    def step_async(self, actions: Any) -> None:
        """Dispatch one step to every env; returns at once. :meth:`step_wait` collects it.

        Raises:
            ClosedEnvironmentError: after :meth:`close`.
            AlreadyPendingCallError: a reset or step is still to be collected.
            AssertionError: ``autoreset_mode=DISABLED`` and an env whose episode ended was
                not reset, as gymnasium's vector envs.
        """
        self._driver.run(self._send_step, self._prepare_step("step_async", actions))

    def _prepare_step(self, call: str, actions: Any) -> TensorDictBase:
        return self._as_input(self._prepare_actions(call, actions))

    def _as_input(self, source: dict[str, Any]) -> TensorDictBase:
        from tensordict import TensorDict

        return TensorDict(source, batch_size=[self.num_envs])

    def _prepare_actions(self, call: str, actions: Any) -> dict[str, Any]:
        """The actions of a step as the entries of its input (checked, before anything is sent)."""
        self._assert_idle(call)
        if self.autoreset_mode is AutoresetMode.DISABLED and self._results.ended.any():
            raise AssertionError(
                f"autoreset_mode=DISABLED: envs {np.flatnonzero(self._results.ended).tolist()} ended "
                "their episode; reset them (options={'reset_mask': ...}) before stepping"
            )
        source: dict[str, Any] = {}
        try:
            self._write_actions(actions, source)
        except NotABatch as exc:
            who = f"{type(self).__name__}.{call}"
            raise TypeError(exc.describe(who, self.num_envs, self.single_action_space)) from None
        return source

    async def _send_step(self, td: TensorDictBase) -> None:
        await self._pool.async_step_send(td)
        self._step_sent()

    def _step_sent(self) -> None:
        """A step went to every env: its results are to be collected."""
        self._received = None
        self._state = AsyncState.WAITING_STEP

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        await self._send_step(td)
        return await self._collect(self._pool.async_step_recv, self._all, None)

    async def _step_columns(self, actions: dict[str, Any]) -> dict[tuple[str, ...], Any]:
        """:meth:`_step` with the actions and results as columns."""
        pool = self._pool
        try:
            columns = pool.step_columns_now(actions)  # the inline executor's lockstep, in one call
        except EnvError:
            await free_others(pool.async_step_recv, self._all)
            raise
        except KeyboardInterrupt:  # raised inside an env: the step is sent, step_wait collects it
            self._step_sent()
            raise
        if columns is not None:
            return columns
        await pool.async_step_send_columns(self._all, actions)
        self._step_sent()
        try:
            return await receive_all_columns(
                pool.async_step_recv_columns, pool.async_step_recv, self.num_envs
            )
        except EnvError:
            self._state = AsyncState.DEFAULT
            raise

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Collect the step sent by :meth:`step_async`.

        Raises:
            NoAsyncCallError: no step was sent.
            VectorEnvTimeoutError: ``timeout`` seconds passed first (the step stays
                collectable); a ``multiprocessing.TimeoutError``, as gymnasium's.
        """
        self._assert_is_running()
        if self._state is not AsyncState.WAITING_STEP:
            raise NoAsyncCallError("Calling `step_wait` without any prior call to `step_async`.", "step")
        td = self._wait("step_wait", self._pool.async_step_recv, self._all, timeout)
        self._state = AsyncState.DEFAULT
        return self._results.step(td, self.copy)

    # -- calls ------------------------------------------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or get the attribute, if not callable); one result per env.

        Example:
            >>> envs = AsyncVectorEnv.from_id("CartPole-v1", num_envs=4, executor="inline")
            >>> envs.call("get_wrapper_attr", "gravity")  # env.get_wrapper_attr("gravity") on every env
            (9.8, 9.8, 9.8, 9.8)
            >>> envs.close()
        """
        self._assert_idle("call")
        return tuple(self._driver.run(self._pool.call, "aenvs_call", name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env, as ``call(name)``.

        Example:
            >>> envs = AsyncVectorEnv.from_id("CartPole-v1", num_envs=4, executor="inline")
            >>> envs.get_attr("gravity")
            (9.8, 9.8, 9.8, 9.8)
            >>> envs.close()
        """
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every env: to ``values[i]`` for a list or tuple, else to ``values``.

        Example:
            >>> envs = AsyncVectorEnv.from_id("CartPole-v1", num_envs=4, executor="inline")
            >>> envs.set_attr("gravity", [9.8, 1.6, 3.7, 24.8])
            >>> envs.get_attr("gravity")
            (9.8, 1.6, 3.7, 24.8)
            >>> envs.close()
        """
        self._assert_idle("set_attr")
        is_sequence = isinstance(values, list | tuple)
        per_env = list(cast("Sequence[Any]", values)) if is_sequence else [values] * self.num_envs
        if len(per_env) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(per_env)}` values for {self.num_envs} environments."
            )
        self._driver.run(self._set_attr, name, per_env)

    async def _set_attr(self, name: str, values: list[Any]) -> None:
        if all(v is values[0] for v in values):
            await self._pool.set_attr(name, values[0])
            return
        await asyncio.gather(*(self._pool.set_attr(name, v, env_index=[i]) for i, v in enumerate(values)))

    def render(self) -> tuple[Any, ...] | None:
        """The rendered frames of the envs (``call("render")``)."""
        return self.call("render")

    def __repr__(self) -> str:
        name = "" if self.spec is None else f"{self.spec.id}, "
        return f"{type(self).__name__}({name}num_envs={self.num_envs})"

"""The per-env runner: the one place where envs are built, stepped, reset and called.

Every executor hosts runners (on the event loop, in a worker thread, process or
actor), so adapting gymnasium envs, auto-reset, seeding, result layout and
exception capture behave the same everywhere. A runner writes fixed-shape results
into its envs' buffer rows and returns a small :class:`Completion` per env (or, for a
command every env answered plainly, one packed record of them all).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal, TypeVar, overload

import numpy as np

from aenvs._adapters import Outcome, build_env, env_kind, first_use, make_adapter, warm
from aenvs._buffers import EnvRows
from aenvs._commands import Command, CommandKind, Completion, Packed, RemoteError, pack
from aenvs._env import EnvContext, EnvFn
from aenvs._env_rows import ColumnRun, EnvSlot
from aenvs._errors import EnvError
from aenvs._scalars import reward_value
from aenvs._specs import EnvSpec, Key, text_spaces

__all__ = ["EnvRunner", "answers", "drive"]

T = TypeVar("T")
_StepTuple = tuple[Any, Any, Any, Any, Any]  # what a gymnasium env's step returns
_STEP, _SMR = CommandKind.STEP, CommandKind.STEP_AND_RESET  # looked up once: every step compares them


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (a plain env's command) without a loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("an async env was run outside an event loop")


class EnvRunner:
    """Hosts some envs of a pool and runs commands on them.

    Example:
        >>> runner = EnvRunner.build({0: "CartPole-v1"}, num_envs=1)
        >>> runner.specs[0].action_space
        Discrete(2)
        >>> runner.close()
    """

    def __init__(
        self,
        adapters: Mapping[int, Any],
        recipes: Mapping[int, tuple[EnvFn, EnvContext, Mapping[str, Any] | None]] | None = None,
    ) -> None:
        self._slots = {
            i: EnvSlot(adapter, texts=text_spaces(adapter.spec.observation_space) or None)
            for i, adapter in adapters.items()
        }
        for i, (fn, _, _) in (recipes or {}).items():  # async envs: no lock is held across awaits
            if not adapters[i].is_async and not warm(kind := env_kind(fn)):
                self._slots[i].env_kind = kind
        self.specs: dict[int, EnvSpec] = {i: a.spec for i, a in adapters.items()}
        self.has_async = any(a.is_async for a in adapters.values())
        self._recipes = dict(recipes or {})  # how each env was built: REBUILD builds it again
        self._run: ColumnRun | None = None  # set by attach
        self._loop: asyncio.AbstractEventLoop | None = None
        # seconds an async env's close may take (a rebuild's, the runner's close), None: unbounded
        self.close_timeout: float | None = None

    @classmethod
    def build(
        cls,
        env_fns: Mapping[int, EnvFn],
        *,
        num_envs: int,
        worker_index: int = 0,
        seeds: Mapping[int, int | None] | None = None,
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> EnvRunner:
        """Build the envs of ``env_fns`` (env index -> factory); raise EnvError naming a failing one."""
        adapters: dict[int, Any] = {}
        recipes = {
            i: (fn, EnvContext(i, worker_index, num_envs, (seeds or {}).get(i)), (make_kwargs or {}).get(i))
            for i, fn in env_fns.items()
        }
        try:
            for i, (fn, context, kwargs) in recipes.items():
                try:
                    adapters[i] = make_adapter(build_env(fn, context, kwargs))
                except Exception as exc:
                    error = RemoteError.capture(exc)
                    raise EnvError(i, "make", error.traceback, error.exc_type) from None
        except BaseException:
            cls(adapters).close()
            raise
        return cls(adapters, recipes)

    @property
    def env_indices(self) -> list[int]:
        return list(self._slots)

    def attach(self, rows: Mapping[int, EnvRows]) -> None:
        """Give each env the buffer rows its results go to and its actions come from."""
        for i, slot in self._slots.items():
            slot.attach(rows[i])
        self._run = ColumnRun.of(self._slots)

    def is_async(self, env_index: int) -> bool:
        """Whether env ``env_index``'s commands are coroutines (an async env)."""
        return self._slots[env_index].adapter.is_async

    # -- running commands -------------------------------------------------------

    @overload
    def execute(self, command: Command, *, packed: Literal[False] = False) -> list[Completion]: ...

    @overload
    def execute(self, command: Command, *, packed: bool) -> list[Completion] | Packed: ...

    def execute(self, command: Command, *, packed: bool = False) -> list[Completion] | Packed:
        """Run ``command`` on every env of it hosted here; async envs run concurrently.
        ``packed``: the answers as one :data:`~aenvs._commands.Packed` record when every env
        answered plainly (plain envs' packed as they answer: no Completion per env)."""
        if self.has_async:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            completions = self._loop.run_until_complete(self.execute_async(command))
            return pack(completions) if packed else completions
        return self.run_plain(command, packed=packed)

    @overload
    def run_plain(
        self, command: Command, stop_at_interrupt: bool = False, *, packed: Literal[False] = False
    ) -> list[Completion]: ...

    @overload
    def run_plain(
        self, command: Command, stop_at_interrupt: bool = False, *, packed: bool
    ) -> list[Completion] | Packed: ...

    def run_plain(
        self, command: Command, stop_at_interrupt: bool = False, *, packed: bool = False
    ) -> list[Completion] | Packed:
        """Run ``command`` on its envs (plain ones, not async), env after env, to their ends now.

        A step of a gymnasium env whose observation is one array (the hot path of every
        executor) runs in this loop itself: its action read from its row, ``env.step``
        called, its results written straight into its rows. ``stop_at_interrupt``: stop
        after an env whose command raised KeyboardInterrupt (answered as its error), leaving
        the envs after it unanswered. ``packed``: when every env answered plainly (no error,
        no extra entries, no value), the answers as one :data:`~aenvs._commands.Packed`
        record rather than a Completion per env.
        """
        kind = command.kind
        indices = command.env_indices
        slots = self._slots
        smr = kind is _SMR
        array_steps = (kind is _STEP or smr) and command.object_actions is None
        # per env its flags; a Completion only for an answer that carries more (by position)
        dones: list[bool] = []
        resets: list[bool] = []
        odd: dict[int, Completion] = {}
        # every env hosted, in order, on the array path: scalars written (and observations
        # carried) a column at a time, until an env leaves that path
        run = self._run if array_steps else None
        if run is not None and indices != run.indices:
            run = None
        rewards: list[float] = []
        terminations: list[bool] = []
        truncations: list[bool] = []
        for i in indices:
            slot = slots[i]
            env_step = slot.env_step if array_steps else None
            was_reset = False
            try:
                if env_step is None:
                    completion = drive(self.execute_one(i, command))
                    done, was_reset = completion.done, completion.was_reset
                    if (
                        completion.error is not None
                        or completion.extras is not None
                        or completion.reset_extras is not None
                        or completion.value is not None
                    ):
                        odd[len(dones)] = completion
                else:
                    out: _StepTuple = env_step(slot.read_action(slot.row))
                    if type(out) is not tuple or len(out) != 5:
                        out = slot.adapter.step_tuple(out)
                    obs, reward, terminated, truncated, info = out
                    view = slot.array_row
                    if type(obs) is np.ndarray and obs.shape == view.shape:  # pyright: ignore[reportOptionalMemberAccess]
                        reward, terminated, truncated = (
                            reward_value(reward),
                            bool(terminated),
                            bool(truncated),
                        )
                        done = terminated or truncated
                        view[...] = obs  # pyright: ignore[reportOptionalSubscript]
                        if run is None:
                            slot.write_scalars(reward, terminated, truncated, done)
                        else:
                            rewards.append(reward)
                            terminations.append(terminated)
                            truncations.append(truncated)
                        extras = _with_info(None, info) if info else None
                    else:  # not the array the space says: the general path, and its errors
                        if run is not None:
                            run.write(rewards, terminations, truncations, dones, smr)
                            run = None
                        outcome = slot.adapter.outcome(out, True)
                        done = outcome.terminated or outcome.truncated
                        extras = self._write_step(slot, outcome, done)
                    reset_extras = extras if smr else None
                    if smr:
                        if done:
                            reset_extras = self._write_reset(slot, slot.adapter.reset(None, None))
                            was_reset = True
                        elif run is None:
                            slot.carry_observation()  # else the run carries it with the others
                    if extras is not None or reset_extras is not None:
                        odd[len(dones)] = Completion(i, kind, None, extras, reset_extras, done, was_reset)
            except BaseException as exc:  # the env's own (a plain env may raise anything, even
                # KeyboardInterrupt or CancelledError): its error, like any other
                odd[len(dones)] = Completion(i, kind, error=RemoteError.capture(exc))
                if run is not None:  # what the run wrote so far, not this env's
                    del rewards[len(dones) :], terminations[len(dones) :], truncations[len(dones) :]
                    run.write(rewards, terminations, truncations, dones, smr)
                    run = None
                done = was_reset = False
            dones.append(done)
            resets.append(was_reset)
            if stop_at_interrupt and odd:
                error = odd.get(len(dones) - 1)
                if error is not None and error.error is not None and error.error.interrupted:
                    break
        if run is not None:
            run.write(rewards, terminations, truncations, dones, smr)
        if packed and not odd:
            return (kind, indices, bytes(dones), bytes(resets))
        return [
            odd.get(position) or Completion(i, kind, None, None, None, d, r)
            for position, (i, d, r) in enumerate(zip(indices, dones, resets, strict=False))
        ]

    async def execute_async(self, command: Command) -> list[Completion]:
        """Run ``command`` on its envs hosted here concurrently, on the running loop."""
        results = await asyncio.gather(
            *(self.execute_one(i, command) for i in command.env_indices), return_exceptions=True
        )
        return answers(command, results)

    async def execute_one(self, i: int, command: Command) -> Completion:
        """Run ``command`` on env ``i``; never raises for the env's own failures."""
        slot = self._slots[i]
        adapter, kind = slot.adapter, command.kind
        try:
            if kind is _STEP or kind is _SMR:
                rows = slot.rows
                assert rows is not None
                objects = command.object_actions
                if objects is not None:  # non-tensor actions: into this process's object rows
                    for key, value in objects[i].items():
                        rows.action[key][rows.row] = value
                # an Outcome, or what a native env's step returned: a plain dict or an awaitable
                if slot.env_kind is None:
                    out: Any = adapter.step(rows.action, rows.row)
                else:
                    out = self._first_use(slot, "step", adapter.step, rows.action, rows.row)
                if type(out) is not Outcome and type(out) is not dict:  # an async env's coroutine
                    out = await out
                # None: not a plain dict it could write (a gym env's Outcome skips the call).
                # The ignores: pyright narrows the adapter's Any to dict[Unknown, Unknown]
                done = self._write_plain_step(slot, out) if type(out) is dict else None  # pyright: ignore[reportUnknownArgumentType]
                extras = None
                if done is None:
                    if type(out) is not Outcome:  # pyright: ignore[reportUnknownArgumentType] - as above
                        out = adapter.outcome(out, True)
                    done = out.terminated or out.truncated
                    extras = self._write_step(slot, out, done)
                completion = Completion(i, kind, None, extras, None, done)
                if kind is _SMR:
                    if done:
                        autoreset = slot.autoreset  # a batched env: only its sub-envs that ended
                        out = adapter.reset(None, None) if autoreset is None else autoreset()
                        if type(out) is not Outcome:
                            out = adapter.outcome(await out, False)
                        completion.reset_extras = self._write_reset(slot, out)
                        completion.was_reset = True
                    else:
                        slot.carry_observation()
                        completion.reset_extras = completion.extras
                return completion
            if kind is CommandKind.RESET:
                assert slot.rows is not None
                seed = command.seeds.get(i) if command.seeds else None
                if slot.env_kind is None:
                    out = adapter.reset(seed, command.options)
                else:
                    out = self._first_use(slot, "reset", adapter.reset, seed, command.options)
                if type(out) is not Outcome:  # an async env's coroutine
                    out = adapter.outcome(await out, False)
                return Completion(i, kind, extras=self._write_reset(slot, out))
            if kind is CommandKind.SEED:
                value = await _resolve(adapter.seed(command.seeds.get(i) if command.seeds else None))
            elif kind is CommandKind.CALL:
                value = await _resolve(
                    adapter.get_attr(command.name)(*command.args, **(command.kwargs or {}))
                )
            elif kind is CommandKind.GET_ATTR:
                value = adapter.get_attr(command.name)
            elif kind is CommandKind.SET_ATTR:
                value = adapter.set_attr(command.name, command.args[0])
            elif kind is CommandKind.REBUILD:
                value = await self._rebuild(i, slot)
            else:  # pragma: no cover - exhaustive over CommandKind
                raise AssertionError(kind)
            return Completion(i, kind, value=value)
        except Exception as exc:
            return Completion(i, kind, error=RemoteError.capture(exc))
        except (KeyboardInterrupt, SystemExit, GeneratorExit) as exc:
            # raised by the env itself: its error, like any other (a worker must not die of it,
            # nor the caller's task be cancelled). An async env's coroutine being closed also
            # raises GeneratorExit at its await: that one is not the env's and goes on.
            if type(exc) is GeneratorExit and adapter.is_async:
                raise
            return Completion(i, kind, error=RemoteError.capture(exc))

    def _first_use(self, slot: EnvSlot, stage: str, run: Callable[..., T], *args: Any) -> T:
        """``run(*args)``, a reset or step of ``slot``'s env while its kind may still import
        modules (aenvs._adapters.building); once its kind is warm, the env leaves this path."""
        kind = slot.env_kind
        out = first_use(kind, stage, run, *args)
        if warm(kind):
            slot.env_kind = None
            if slot.rows is not None:
                slot.attach(slot.rows)
                self._run = ColumnRun.of(self._slots)
        return out

    async def rebuild(self, i: int) -> None:
        """Close env ``i`` and build it again from its factory, into the same buffer rows.

        Raises EnvError (command ``"make"``) when the factory fails.
        """
        try:
            await self._rebuild(i, self._slots[i])
        except Exception as exc:
            error = RemoteError.capture(exc)
            raise EnvError(i, "make", error.traceback, error.exc_type) from None

    async def _rebuild(self, i: int, slot: EnvSlot) -> None:
        # the env failed before: closing it may fail or hang too, and must not stop the rebuild
        await _bounded_close(slot, self.close_timeout)
        fn, context, kwargs = self._recipes[i]
        fresh = EnvSlot(make_adapter(build_env(fn, context, kwargs)))
        difference = self.specs[i].layout_difference(fresh.adapter.spec)
        if difference is not None:
            await _bounded_close(fresh, self.close_timeout)
            raise ValueError(f"env {i} was rebuilt with a different layout: {difference}")
        slot.adapter, slot.closed = fresh.adapter, False
        if slot.rows is not None:
            slot.attach(slot.rows)
            self._run = ColumnRun.of(self._slots)

    @staticmethod
    def _write_plain_step(slot: EnvSlot, out: dict[str, Any]) -> bool | None:
        """Write a native env's step result, a plain dict of exactly its one observation entry,
        ``"reward"``, ``"terminated"`` and maybe ``"truncated"``, straight into its rows, and
        return ``done``; None (nothing written) for any other dict, which goes through
        ``outcome`` (and its error messages).

        The common native step, without the Outcome, items list and key walk of the general
        path (what that is worth: docs/performance.md, "Why the code is as it is").
        """
        view = slot.plain_row
        if view is None:
            return None
        # the entry count and three lookups pin the keys down (no set built per step)
        size = len(out)
        if size == 3:
            truncated = False
        elif size == 4 and "truncated" in out:
            truncated = bool(out["truncated"])
        else:
            return None
        value = out.get(slot.plain_name)  # pyright: ignore[reportArgumentType] - set with plain_row
        if type(value) is not np.ndarray or value.shape != view.shape:
            return None
        if "reward" not in out or "terminated" not in out:
            return None
        reward, terminated = reward_value(out["reward"]), bool(out["terminated"])
        done = terminated or truncated
        view[...] = value
        slot.write_scalars(reward, terminated, truncated, done)
        return done

    def _write_reset(self, slot: EnvSlot, out: Outcome) -> dict[Key, Any] | None:
        assert slot.rows is not None
        extras = slot.write_items(slot.rows.reset, out.items)
        for flag in slot.reset_flags:
            flag[0] = False
        return _with_info(extras, out.info)

    def _write_step(self, slot: EnvSlot, out: Outcome, done: bool) -> dict[Key, Any] | None:
        assert slot.rows is not None
        items, reward, terminated, truncated, info = out
        extras = slot.write_items(slot.rows.step, items)
        slot.write_scalars(reward, terminated, truncated, done)
        return _with_info(extras, info) if info else extras

    # -- closing: each env exactly once, whatever path gets there first ----------------

    async def aclose(self) -> None:
        """Close every env not closed yet, on the caller's loop; async ``close`` methods run
        concurrently, each within ``close_timeout`` (then cancelled). A close that raises
        or hangs does not stop the others'."""
        await asyncio.gather(*(_bounded_close(slot, self.close_timeout) for slot in self._slots.values()))
        self._close_loop()

    def close(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Close every env not closed yet, from synchronous code (a worker thread or process,
        or ``kill``).

        Async ``close`` methods run on the loop the envs ran on: ``loop`` (not running), or
        the runner's own, after cancelling the commands it still holds (e.g. a step a
        SIGTERM interrupted), each within ``close_timeout``. Called on a running loop (the
        inline executor's ``kill``), the plain envs close now and the async ones in tasks
        of that loop.
        """
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            for slot in self._slots.values():
                try:
                    result = slot.close()
                except Exception:
                    continue
                if inspect.isawaitable(result):
                    _detach(running, self._bounded(result))
            self._close_loop()
            return
        if self.has_async and loop is not None:
            loop.run_until_complete(self.aclose())
        elif self.has_async:
            loop = self._loop if self._loop is not None else asyncio.new_event_loop()
            self._loop = loop
            leftover = asyncio.all_tasks(loop)
            for task in leftover:
                task.cancel()
            if leftover:
                loop.run_until_complete(asyncio.wait(leftover, timeout=self.close_timeout))
            loop.run_until_complete(self.aclose())
        else:
            for slot in self._slots.values():
                try:
                    slot.close()
                except Exception:
                    pass
        self._close_loop()

    async def _bounded(self, awaitable: Any) -> None:
        try:
            await asyncio.wait_for(_resolve(awaitable), self.close_timeout)
        except (Exception, asyncio.CancelledError):
            pass

    def _close_loop(self) -> None:
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
            self._loop = None


def answers(command: Command, results: list[Any]) -> list[Completion]:
    """Completions of ``command`` from gathered :meth:`EnvRunner.execute_one` results, in order;
    an exception in their place (an async env raising ``GeneratorExit``, which the runner lets
    through) becomes its env's error, so that one env cannot take the others' answers with it."""
    return [
        Completion(i, command.kind, error=RemoteError.capture(r)) if isinstance(r, BaseException) else r
        for i, r in zip(command.env_indices, results, strict=True)
    ]


async def _bounded_close(slot: EnvSlot, timeout: float | None) -> None:
    """Close ``slot``'s env (once), an async close within ``timeout``; never raises for the env."""
    try:
        result = slot.close()
        if inspect.isawaitable(result):
            await asyncio.wait_for(_resolve(result), timeout)
    except Exception:
        pass  # raised or timed out (wait_for cancelled it): the other envs still close


_DETACHED: set[asyncio.Task[Any]] = set()  # closes run by tasks nobody awaits: kept until they end


def _detach(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
    task = loop.create_task(coro)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _with_info(extras: dict[Key, Any] | None, info: Mapping[str, Any] | None) -> dict[Key, Any] | None:
    if not info:
        return extras
    extras = extras if extras is not None else {}
    extras[("info",)] = info
    return extras

"""Sending: env indices read and checked, actions and resets dispatched, timeouts armed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from tensordict import TensorDict, TensorDictBase

from aenvs._batching import Batcher
from aenvs._commands import TRANSITIONS, Command, CommandKind, Packed
from aenvs._env import EnvState
from aenvs._extras import put
from aenvs._indices import read_env_index
from aenvs._pool.deadlines import Deadlines
from aenvs._pool.failures import Failures
from aenvs._pool.limits import Limits
from aenvs._pool.restarts import RestartSupervisor
from aenvs._pool.slots import SlotTable
from aenvs._rate_limit import RateLimit
from aenvs._seeding import seed_chain
from aenvs._specs import EnvSpec, Key
from aenvs._tensors import root_entries, shallow_copy, td_get, td_unchecked
from aenvs.executors import Executor

__all__ = ["TD_ENV_INDEX", "EnvIndex", "Seed", "Sender", "check_options", "member_index"]

EnvIndex = int | Sequence[int] | torch.Tensor
Seed = int | Sequence[int | None] | None
TD_ENV_INDEX = "the input's 'env_index' entry"


def check_options(options: object) -> None:
    """Refuse reset options that are not a dict (gymnasium's ``reset(options=...)``), naming them.

    Example:
        >>> check_options({"prompt": "hi"})
        >>> check_options("hi")
        Traceback (most recent call last):
        ...
        TypeError: reset options must be a dict (gymnasium's reset(options=...)) or None, got str 'hi'; pass options={'task': 'hi'}, say, and read options['task'] in the env
    """
    if options is not None and not isinstance(options, Mapping):
        shown = repr(options) if len(repr(options)) <= 60 else repr(options)[:57] + "..."
        raise TypeError(
            f"reset options must be a dict (gymnasium's reset(options=...)) or None, got "
            f"{type(options).__name__} {shown}; pass options={{'task': {shown}}}, say, and read "
            "options['task'] in the env"
        )


def member_index(td: TensorDictBase) -> Any:
    """``td["env_index"]`` (None if absent), one per env: a batch of members with a batch
    shape of their own carries it expanded over their sub-envs (``[B, *batch_shape]``).

    Example:
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"env_index": torch.tensor([[2, 2], [0, 0]])}, [2, 2])
        >>> member_index(td).tolist()
        [2, 0]
    """
    value = root_entries(td).get("env_index") if type(td) is TensorDict else td_get(td, "env_index")
    if isinstance(value, torch.Tensor) and value.dim() > 1 and td.batch_dims > 1:
        return value.flatten(1)[:, 0]
    return value


class Sender:
    """Reads the envs a command goes to, checks they are free, and dispatches it.

    Args:
        executor: runs the commands.
        slots: the pool's slot table (which envs are busy; what was sent when).
        failures: the timeouts per command kind (a timer per command that has one).
        restarts: the envs past their restart budget (sends to them fail at once).
        first_seeds: per env, the seed of its first reset (None once reset).
        ready: checks the pool can send now (open, on its loop) and returns its batcher.
        drain: records what arrived (before a timeout stops what did not).
        closed: whether the pool is closed.
        max_concurrency: transition commands running at once, or None (see :class:`Limits`).
        rate_limit: a token bucket transition commands take a token per env from, or None.

    Example:
        >>> from aenvs.executors import make_executor
        >>> executor, slots = make_executor("inline"), SlotTable(3)
        >>> async def rebuild(indices: list[int]) -> None: ...
        >>> restarts = RestartSupervisor(executor, num_envs=3, max_restarts=0, backoff=0.0,
        ...     is_free=slots.is_free, rebuild_in_place=rebuild, rebuilt=print, broke=print)
        >>> failures = Failures(executor, num_envs=3, step_timeout=None, reset_timeout=None)
        >>> sender = Sender(executor, slots, failures, restarts, [None] * 3,
        ...     ready=lambda: None, drain=lambda: None, closed=lambda: False)
        >>> sender.indices(torch.tensor([2, 0])), sender.targets(None, None)
        ([2, 0], [0, 1, 2])
    """

    def __init__(
        self,
        executor: Executor,
        slots: SlotTable,
        failures: Failures,
        restarts: RestartSupervisor,
        first_seeds: list[int | None],
        *,
        ready: Callable[[], Batcher],
        drain: Callable[[], None],
        closed: Callable[[], bool],
        max_concurrency: int | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.num_envs = len(first_seeds)
        self.all_envs = list(range(self.num_envs))
        self.first_seeds = first_seeds
        self.specs: list[EnvSpec] = []
        self._executor = executor
        self._slots = slots
        self._failures = failures
        self._restarts = restarts
        self._ready = ready
        self._drain = drain
        self._closed = closed
        self.deadlines: Deadlines | None = None  # episode_timeout / on_timeout="truncate"
        self.limits: Limits | None = None
        if max_concurrency is not None or rate_limit is not None:
            self.limits = Limits(
                slots,
                max_concurrency=max_concurrency,
                rate_limit=rate_limit,
                dispatch=self._submit,
                drain=drain,
                wait_ready=executor.wait_ready,
                wake=executor.wake,
                closed=closed,
            )

    def indices(self, env_index: EnvIndex | None, name: str = "env_index") -> list[int] | None:
        """The envs ``env_index`` names, checked (None: it names none)."""
        if env_index is None:
            return None
        if env_index is self.all_envs:  # what a whole-batch send returned, handed back
            return self.all_envs
        num_envs = self.num_envs
        indices = read_env_index(env_index, num_envs, name)
        if indices == self.all_envs:
            return self.all_envs  # shared, never mutated
        if not indices:
            raise ValueError(f"{name} is empty: it names no env (a call needs at least one)")
        if min(indices) < 0 or max(indices) >= num_envs:
            bad = next(i for i in indices if not 0 <= i < num_envs)
            raise IndexError(f"{name}: env index {bad} is out of range for a pool of {num_envs} envs")
        if len(set(indices)) != len(indices):
            seen: set[int] = set()
            bad = next(i for i in indices if i in seen or seen.add(i))
            raise ValueError(f"{name}: env index {bad} appears more than once")
        return indices

    def targets(self, td: TensorDictBase | None, env_index: EnvIndex | None) -> list[int]:
        """The envs a command goes to (``env_index``, ``td["env_index"]`` or all), each free."""
        indices = self.indices(env_index)
        if indices is None and td is not None:
            indices = self.indices(member_index(td), TD_ENV_INDEX)
        if indices is None:
            if td is not None and td.batch_size[:1] != torch.Size([self.num_envs]):
                raise ValueError(
                    f"the input has batch size {tuple(td.batch_size)} and no 'env_index' entry; "
                    f"pass env_index= or a batch of {self.num_envs}"
                )
            indices = self.all_envs
        if td is not None and (not (batch := td.batch_size) or batch[0] != len(indices)):
            raise ValueError(
                f"the input has batch size {tuple(td.batch_size)} for {len(indices)} env indices"
            )
        self._slots.check_free(indices)
        if self._restarts.broken:
            self._restarts.check_not_broken(indices, self._executor.name)
        return indices

    def dispatch(self, command: Command) -> None:
        """Send ``command``: to the executor, or, for a transition over the pool's limits, held
        until they let it go."""
        now = time.perf_counter()
        self._slots.sent(command.kind, command.env_indices, now)
        limits = self.limits
        if limits is not None and command.kind in TRANSITIONS:
            limits.admit(command, now)
        else:
            self._submit(command, now)

    def _submit(self, command: Command, sent_at: float) -> None:
        """Hand ``command`` (sent at ``sent_at``) to the executor; arm its timeout if its kind
        has one, counted from now."""
        deadlines = self.deadlines
        if deadlines is not None:
            sending = deadlines.submitting(command, sent_at)  # not the steps whose episode is over
            if sending is None:
                return
            command = sending
        limit = self._failures.limit(command.kind)
        if limit is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(limit, self._expire, command.env_indices, sent_at, limit)
        self._executor.submit(command)

    def close(self) -> None:
        """The pool closes: the commands its limits hold are dropped, never dispatched."""
        if self.limits is not None:
            self.limits.close()

    def _expire(self, indices: list[int], sent_at: float, limit: float) -> None:
        """A timeout fired: stop the workers of the envs still running that command."""
        if self._closed():
            return
        self._drain()  # what already arrived is not late
        stuck = self._slots.stuck(indices, sent_at)
        if stuck:
            self._failures.expired(stuck, limit)
            # the executor answers every command of the stopped workers with a crash; the
            # slot table records the stuck envs' ones as EnvTimeoutError (Failures.on_failure)
            self._executor.abort(stuck)

    def send_actions(self, kind: CommandKind, td: TensorDictBase, env_index: EnvIndex | None) -> list[int]:
        """Dispatch a step (or step-and-reset) with the actions of ``td``; the envs it went to."""
        batcher = self._ready()
        given = cast(object, td)
        if not isinstance(given, TensorDictBase):
            raise TypeError(f"expected a TensorDict of actions, got {type(given).__name__}")
        indices = self.targets(td, env_index)
        checked = batcher.check_actions(td, indices)
        objects = batcher.objects.read(td, indices)  # None unless some action is not a tensor
        batcher.write_actions(td, indices, checked)
        # later key changes by the caller do not reach the results
        self._slots.keep_inputs(shallow_copy(td), indices)
        self.dispatch(Command(kind, indices, object_actions=objects))
        return indices

    def whole_now_open(self, kind: CommandKind) -> bool:
        """Whether a whole batch of ``kind`` sent now may run right here (:meth:`send_whole_now`):
        the executor runs commands in the caller (:meth:`Executor.runs_now`), every env is
        free and not broken, and no limits, deadlines or step timeout apply."""
        slots = self._slots
        return not (
            self.limits is not None
            or self.deadlines is not None
            or self._restarts.broken
            or slots.in_flight
            or slots.ready
            or slots.answers
            or slots.orphans
            or not self._executor.runs_now()
            or self._failures.limit(kind) is not None
        )

    def send_whole_now(self, kind: CommandKind, td: TensorDictBase) -> Packed | list[int] | None:
        """Send a step (or step-and-reset) with the actions of ``td`` to every env and have the
        executor run it right here; only where :meth:`whole_now_open` holds (and the pool's
        other parts agree: :meth:`PoolParts.whole_now_open`).

        Returns the answers packed when every env answered plainly (recorded and taken: the
        results are in the buffers, ``td`` is the batch's input); the envs, when the answers
        wait in the executor for a receive as usual; None when nothing was sent (the input
        is not plainly a batch of every env: send it the usual way, which says why).
        """
        batcher = self._ready()
        if not isinstance(cast(object, td), TensorDictBase):
            return None  # the usual send refuses it
        indices = self.targets(td, None)
        if indices is not self.all_envs:  # an "env_index" entry naming some envs, or an order
            return None
        checked = batcher.check_actions(td, indices)
        objects = batcher.objects.read(td, indices)
        batcher.write_actions(td, indices, checked)
        return self._run_whole_now(kind, objects, lambda: shallow_copy(td))

    def send_checked_now(
        self, kind: CommandKind, checked: Mapping[Key, torch.Tensor], batcher: Batcher
    ) -> Packed | list[int]:
        """:meth:`send_whole_now` of actions already checked (:meth:`Batcher.root_actions`),
        where :meth:`whole_now_open` holds."""
        batcher.write_checked(checked)
        size = torch.Size([self.num_envs])
        return self._run_whole_now(
            kind, None, lambda: td_unchecked({key[0]: value for key, value in checked.items()}, size)
        )

    def _run_whole_now(
        self, kind: CommandKind, objects: Any, inputs: Callable[[], TensorDictBase]
    ) -> Packed | list[int]:
        """Run the command of ``kind`` to every env, its actions written, now; ``inputs``
        makes the batch's input, kept for a receive when the answers are not all plain."""
        indices, slots = self.all_envs, self._slots
        sent = time.perf_counter()
        answers = self._executor.run_now(Command(kind, indices, object_actions=objects))
        if answers is None:  # queued, not drained yet: recorded as sent then, as for any send
            slots.sent(kind, indices, sent)
            slots.keep_inputs(inputs(), indices)
            return indices
        slots.ran_whole(kind, answers, sent, time.perf_counter())
        return answers

    def send_columns(self, kind: CommandKind, env_index: list[int], actions: Mapping[Any, Any]) -> list[int]:
        """:meth:`send_actions` with the actions by key as tensors or lists of values."""
        batcher = self._ready()
        indices = self.targets(None, env_index)
        num_rows = len(indices)
        columns: dict[Key, Any] = {}
        tensors: dict[str, Any] = {}
        for key, value in actions.items():
            path: Key = (key,) if type(key) is str else tuple(key)
            columns[path] = value
            if isinstance(value, torch.Tensor):
                rows = value.shape[0] if value.ndim else 0
                if type(key) is str:
                    tensors[key] = value
                else:
                    put(tensors, path, value)
            else:
                rows = len(value)
            if rows != num_rows:
                raise ValueError(f"the actions {'.'.join(path)!r} have {rows} rows for {num_rows} envs")
        td = td_unchecked(tensors, torch.Size([num_rows]))
        try:
            checked = batcher.check_actions(td, indices)
        except ValueError:  # a list given for a tensor entry reads as a missing entry: say so
            for path, value in columns.items():
                if not isinstance(value, torch.Tensor):
                    self._check_not_fixed(path, value, indices)
            raise
        objects = batcher.objects.read(td, indices, columns)
        batcher.write_actions(td, indices, checked)
        self._slots.keep_inputs(td, indices)
        self.dispatch(Command(kind, indices, object_actions=objects))
        return indices

    def _check_not_fixed(self, path: Key, values: Any, indices: list[int]) -> None:
        """Raise TypeError, naming the env and the key, where values given as a list (text,
        objects) go to an action entry that is a tensor of fixed shape."""
        for i in indices:
            leaf = next((leaf for leaf in self.specs[i].action_leaves if leaf.key == path), None)
            if leaf is not None and not leaf.is_object:
                kinds = sorted({type(v).__name__ for v in values})
                raise TypeError(
                    f"env {i}: the actions {'.'.join(path)!r} are a list of {'/'.join(kinds)} values, "
                    f"expected numbers of {leaf.describe()} per env (a tensor, or a list of numbers) "
                    f"for the action space {self.specs[i].action_space}"
                )

    def send_reset(
        self,
        td: TensorDictBase | None,
        env_index: EnvIndex | None,
        seed: Seed,
        options: Mapping[str, Any] | None,
    ) -> list[int]:
        """Dispatch a reset (``seed``: an int starts a seed chain, a sequence is one per env)."""
        self._ready()
        check_options(options)
        indices = self.targets(td, env_index)
        if seed is None:
            seeds = [self.first_seeds[i] for i in indices]
        elif isinstance(seed, int):
            seeds = seed_chain(seed, len(indices))[0]
        else:
            seeds = list(seed)
            if len(seeds) != len(indices):
                raise ValueError(f"{len(seeds)} seeds for {len(indices)} envs")
        for i in indices:
            self.first_seeds[i] = None
        self._slots.mark(indices, EnvState.RESET)
        seeds_by_env = dict(zip(indices, seeds, strict=True))
        self.dispatch(
            Command(
                CommandKind.RESET, indices, seeds=seeds_by_env, options=dict(options) if options else None
            )
        )
        return indices

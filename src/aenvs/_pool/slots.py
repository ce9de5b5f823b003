"""The pool's per-env slot table: what each env is doing, and what it has to give back.

Pure bookkeeping, with no executor and no event loop: the pool tells the table what it
sent (:meth:`SlotTable.sent`) and what came back (:meth:`SlotTable.record`), and takes
the results from it (:meth:`SlotTable.take`, :meth:`SlotTable.consume`). Commands are
one per env at a time: an env is busy from its send until its result is received.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence

from tensordict import TensorDictBase

from aenvs._commands import TRANSITIONS, CommandKind, Completion, Packed
from aenvs._env import EnvState
from aenvs._errors import EnvBusyError
from aenvs._gathering import Inputs, SentInputs
from aenvs._pool.latency import MASK, SHIFT, LatencyWindows

__all__ = ["SlotTable"]

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET
_RUN, _DONE, _ERROR = EnvState.RUN, EnvState.DONE, EnvState.ERROR
_COLUMNS_FROM = 16


class SlotTable:
    """Per env: its state, the command in flight, its ready result or answer, its inputs, its latencies.

    Args:
        num_envs: envs of the pool.
        executor: the executor's name, for the errors raised.
        vet: called with each successful transition result as it is recorded (it may set
            the completion's ``error``), or None.
        on_failure: called with each failed completion as it is recorded (it may replace
            the completion's ``error``), or None.

    Transition results (reset, step, step-and-reset) wait in ``ready`` until a receive takes
    them; answers to the other commands (calls, attributes, seeds) wait in ``answers``.

    Example:
        >>> from aenvs._commands import CommandKind, Completion
        >>> table = SlotTable(2)
        >>> table.sent(CommandKind.RESET, [0, 1], now=0.0)
        >>> table.record([Completion(1, CommandKind.RESET)], now=0.5)
        >>> [c.env_index for c in table.take(CommandKind.RESET, None, None)], table.in_flight
        ([1], 1)
    """

    def __init__(
        self,
        num_envs: int,
        executor: str = "",
        *,
        vet: Callable[[Completion], None] | None = None,
        on_failure: Callable[[Completion], None] | None = None,
    ) -> None:
        self.num_envs = num_envs
        self._every_env = list(range(num_envs))
        # whole batches recorded a column at a time: below this many envs, env by env costs less
        self._by_column = num_envs >= _COLUMNS_FROM
        self.executor = executor
        self.vet = vet
        self.on_failure = on_failure
        self.states = [EnvState.VOID] * num_envs
        self.pending: list[CommandKind | None] = [None] * num_envs  # the kind in flight
        self.ready: dict[int, Completion] = {}  # transition results not yet received
        self.answers: dict[int, Completion] = {}  # answers to other commands, not yet collected
        self.orphans: set[int] = set()  # envs whose answer's caller was cancelled: dropped on arrival
        self.inputs: list[TensorDictBase | None] = [None] * num_envs  # the batch each env's step came in
        self.input_rows = [0] * num_envs  # ... and its row there
        self.outstanding: Counter[CommandKind] = Counter()  # transitions in flight or ready, by kind
        self.in_flight = 0
        self.sent_at = [0.0] * num_envs
        # when each env's command reached the executor: when it was sent, unless the pool's
        # limits hold commands (then a list of its own, which aenvs._pool.limits writes)
        self.dispatched_at = self.sent_at
        self.taken_at = [0.0] * num_envs  # when each env's last result was received (0: none)
        self.env_latency = LatencyWindows(num_envs)  # dispatch to completion, per transition
        self.policy_wait = LatencyWindows(num_envs)  # result received to next transition sent
        self.steps = [0] * num_envs
        self.latency_sum = [0.0] * num_envs
        self.latency_last = [0.0] * num_envs
        self.errors = [0] * num_envs
        self.failed_ready = 0  # transition results in ``ready`` that are errors
        # results that will never be received, counted: dropped (their caller gave up), or
        # withdrawn or cleared as the pool closed; a waiting receive checks that it can
        # still be satisfied only when this moved
        self.losses = 0

    # -- sending ---------------------------------------------------------------------

    def check_free(self, indices: Sequence[int]) -> None:
        """Raise EnvBusyError for the first env of ``indices`` with a command in flight or a
        result (or answer) not yet received."""
        pending, ready, answers, orphans = self.pending, self.ready, self.answers, self.orphans
        if not self.in_flight and not ready and not answers and not orphans:
            return  # every env is free (the usual lockstep send)
        for i in indices:
            if pending[i] is not None or i in ready or i in answers or i in orphans:
                raise EnvBusyError(i)

    def sent(self, kind: CommandKind, indices: Sequence[int], now: float) -> None:
        """A command of ``kind`` went to ``indices`` at time ``now``."""
        pending, sent_at = self.pending, self.sent_at
        self.in_flight += len(indices)
        if kind not in TRANSITIONS:
            for i in indices:
                pending[i] = kind
                sent_at[i] = now
            return
        self.outstanding[kind] += len(indices)
        if self._by_column and indices == self._every_env and self._sent_to_all(kind, now):
            return
        taken, waits, counts = self.taken_at, self.policy_wait.ring, self.policy_wait.counts
        for i in indices:
            pending[i] = kind
            sent_at[i] = now
            t = taken[i]
            if t:  # a sample in env i's window (LatencyWindows.add, inline)
                n = counts[i]
                waits[(i << SHIFT) | (n & MASK)] = now - t
                counts[i] = n + 1

    def _sent_to_all(self, kind: CommandKind, now: float) -> bool:
        """:meth:`sent` of a transition to every env, a column at a time, when every env's
        last result was received at the same time (a lockstep loop); False, nothing done,
        otherwise."""
        taken, n = self.taken_at, self.num_envs
        t = taken[0]
        if taken.count(t) != n or (t and not self.policy_wait.add_to_all(now - t)):
            return False
        self.pending[:] = [kind] * n
        self.sent_at[:] = [now] * n
        return True

    def withdraw(self, kind: CommandKind, indices: Sequence[int]) -> None:
        """The ``kind`` command sent to ``indices`` never went out (held when the pool closed)."""
        pending = self.pending
        for i in indices:
            pending[i] = None
        self.in_flight -= len(indices)
        self.losses += len(indices)
        self.outstanding[kind] -= len(indices)

    def keep_inputs(self, td: TensorDictBase, indices: Sequence[int]) -> None:
        """Keep ``td`` (row ``r`` for ``indices[r]``) for the results of the steps it sends."""
        # batch and row in two lists, not a tuple per env: per-step objects that live as long
        # as a step are what sets off CPython's full garbage collections
        inputs, rows = self.inputs, self.input_rows
        for row, i in enumerate(indices):
            inputs[i] = td
            rows[i] = row

    def mark(self, indices: Sequence[int], state: EnvState) -> None:
        """Set the state of ``indices``."""
        states = self.states
        for i in indices:
            states[i] = state

    def stuck(self, indices: Sequence[int], sent_at: float) -> list[int]:
        """The envs of ``indices`` still running the command they were sent at ``sent_at``."""
        pending, sent = self.pending, self.sent_at
        return [i for i in indices if pending[i] is not None and sent[i] == sent_at]

    # -- completions -----------------------------------------------------------------

    def record(self, completions: Sequence[Completion], now: float) -> None:
        """Record completions that arrived at time ``now``: states, latencies, ready results."""
        # runs for every completion: attributes looked up once, kinds compared by identity
        pending, ready, states, dispatched_at = self.pending, self.ready, self.states, self.dispatched_at
        steps, latency_sum, latency_last = self.steps, self.latency_sum, self.latency_last
        in_env, in_env_counts = self.env_latency.ring, self.env_latency.counts
        vet, on_failure = self.vet, self.on_failure
        for c in completions:
            i, kind = c.env_index, c.kind
            if pending[i] is None:  # an answer for a command abandoned by close
                continue
            pending[i] = None
            self.in_flight -= 1
            if vet is not None and c.error is None and kind in TRANSITIONS:
                vet(c)
            if c.error is not None and on_failure is not None:
                on_failure(c)
            if kind is not _STEP and kind is not _SMR and kind is not _RESET:  # not in TRANSITIONS
                if c.error is not None:
                    self.errors[i] += 1
                if i in self.orphans:  # its caller was cancelled
                    self.orphans.discard(i)
                else:
                    self.answers[i] = c
                continue
            ready[i] = c
            if c.error is not None:
                self.errors[i] += 1
                self.failed_ready += 1
                states[i] = _ERROR
                continue
            latency = now - dispatched_at[i]
            n = in_env_counts[i]  # a sample in env i's window (LatencyWindows.add, inline)
            in_env[(i << SHIFT) | (n & MASK)] = latency
            in_env_counts[i] = n + 1
            if kind is _RESET:
                states[i] = _RUN
                continue
            steps[i] += 1
            latency_sum[i] += latency
            latency_last[i] = latency
            states[i] = _DONE if c.done and not c.was_reset else _RUN

    def wholly_in_flight(self, kind: CommandKind) -> bool:
        """Whether every env has a ``kind`` in flight and nothing is ready (a lockstep batch)."""
        n = self.num_envs
        return self.in_flight == n and self.outstanding[kind] == n and not self.ready and not self.answers

    def complete_whole(self, kind: CommandKind, answers: Packed, now: float) -> None:
        """Record and consume at once the plain answers of every env to a whole-batch ``kind``
        (:meth:`wholly_in_flight` held), arrived at ``now``: :meth:`record`, :meth:`take` and
        :meth:`consume` of their completions in one pass, with no completion made."""
        _, indices, done, was_reset = answers
        self.in_flight -= len(indices)
        self.outstanding[kind] -= len(indices)
        if self._by_column and indices == self._every_env and self._completed_all(kind, done, was_reset, now):
            return
        self._answered_each(kind, answers, now, None)

    def ran_whole(self, kind: CommandKind, answers: Packed, sent: float, now: float) -> None:
        """A whole-batch ``kind`` sent to every env at ``sent`` and answered plainly at
        ``now``, run by the executor in the sender's call (no limits: dispatched as sent):
        :meth:`sent` and :meth:`complete_whole` in one pass."""
        if self._by_column:
            self.sent(kind, answers[1], sent)
            self.complete_whole(kind, answers, now)
            return
        self._answered_each(kind, answers, now, sent)

    def _answered_each(self, kind: CommandKind, answers: Packed, now: float, sent: float | None) -> None:
        """The per-env part of :meth:`complete_whole`, env by env; with ``sent`` (a batch run
        where it was sent at that time, :meth:`ran_whole`) that of :meth:`sent` too, the
        envs' pending kinds and counts left as they were before the send."""
        _, indices, done, was_reset = answers
        pending, states, dispatched_at, taken = self.pending, self.states, self.dispatched_at, self.taken_at
        steps, latency_sum, latency_last = self.steps, self.latency_sum, self.latency_last
        in_env, in_env_counts = self.env_latency.ring, self.env_latency.counts
        waits, wait_counts = self.policy_wait.ring, self.policy_wait.counts
        step = kind is not _RESET
        for i, d, r in zip(indices, done, was_reset, strict=True):
            if sent is None:
                pending[i] = None
                latency = now - dispatched_at[i]
            else:
                dispatched_at[i] = sent  # sent_at: no limits hold a batch run where it is sent
                t = taken[i]
                if t:  # a sample in env i's window (LatencyWindows.add, inline)
                    n = wait_counts[i]
                    waits[(i << SHIFT) | (n & MASK)] = sent - t
                    wait_counts[i] = n + 1
                latency = now - sent
            taken[i] = now
            n = in_env_counts[i]
            in_env[(i << SHIFT) | (n & MASK)] = latency
            in_env_counts[i] = n + 1
            if step:
                steps[i] += 1
                latency_sum[i] += latency
                latency_last[i] = latency
                states[i] = _DONE if d and not r else _RUN
            else:
                states[i] = _RUN

    def _completed_all(self, kind: CommandKind, done: bytes, was_reset: bytes, now: float) -> bool:
        """The per-env part of :meth:`complete_whole` for every env, a column at a time, when
        they were all dispatched at the same time; False, nothing done, otherwise."""
        dispatched_at, n = self.dispatched_at, self.num_envs
        sent = dispatched_at[0]
        latency = now - sent
        if dispatched_at.count(sent) != n or not self.env_latency.add_to_all(latency):
            return False
        self.pending[:] = [None] * n
        self.taken_at[:] = [now] * n
        if kind is _RESET:
            self.states[:] = [_RUN] * n
            return True
        self.steps[:] = [s + 1 for s in self.steps]
        self.latency_sum[:] = [s + latency for s in self.latency_sum]
        self.latency_last[:] = [latency] * n
        if done == was_reset:  # every episode that ended was reset (or none ended)
            self.states[:] = [_RUN] * n
        else:
            self.states[:] = [_DONE if d and not r else _RUN for d, r in zip(done, was_reset, strict=True)]
        return True

    # -- taking results --------------------------------------------------------------

    def may_take(self, min_get: int) -> bool:
        """Whether a take of at least ``min_get`` results could succeed, or raise an error,
        now (False: not enough results are ready, none of them an error)."""
        return len(self.ready) >= min_get or self.failed_ready > 0

    def check_due(self, kind: CommandKind, wanted: Sequence[int]) -> None:
        """Raise ValueError for the first env of ``wanted`` with no ``kind`` in flight or ready."""
        pending, ready = self.pending, self.ready
        for i in wanted:
            if pending[i] is not kind and not (i in ready and ready[i].kind is kind):
                raise ValueError(f"env {i} has no {kind.value} in flight or ready to receive")

    def take(self, kind: CommandKind, wanted: Sequence[int] | None, max_get: int | None) -> list[Completion]:
        """Pick ready results of ``kind`` from ``wanted`` (None: any env), at most ``max_get``.

        Raises the first error among them as an EnvError (that result is consumed); consumes
        nothing else: :meth:`consume` does, once the picked results are enough.
        """
        picked: list[Completion] = []
        ready = self.ready
        if wanted is None:
            for i, c in ready.items():
                if c.kind is kind:
                    if c.error is not None:
                        self._raise(i)
                    picked.append(c)
                    if max_get is not None and len(picked) >= max_get:
                        break
        else:
            for i in wanted:
                c = ready.get(i)
                if c is not None and c.kind is kind:
                    if c.error is not None:
                        self._raise(i)
                    picked.append(c)
                    if max_get is not None and len(picked) >= max_get:
                        break
        return picked

    def take_unheld(self, kind: CommandKind, limit: int, held: Collection[int]) -> list[Completion]:
        """:meth:`take` for any env but ``held`` (envs other receives wait for), at most ``limit``."""
        picked: list[Completion] = []
        if limit <= 0:
            return picked
        for i, c in self.ready.items():
            if c.kind is kind and i not in held:
                if c.error is not None:
                    self._raise(i)
                picked.append(c)
                if len(picked) >= limit:
                    break
        return picked

    def _raise(self, i: int) -> None:
        c = self.ready.pop(i)
        self.failed_ready -= 1
        self.inputs[i] = None
        self.taken_at[i] = time.perf_counter()
        self.outstanding[c.kind] -= 1
        assert c.error is not None
        raise c.error.to_exception(i, c.kind.value, self.executor)

    def consume(self, kind: CommandKind, picked: Sequence[Completion]) -> None:
        """The results ``picked`` (of ``kind``) are received: their envs are free again."""
        ready, taken, now = self.ready, self.taken_at, time.perf_counter()
        for c in picked:
            i = c.env_index
            del ready[i]
            taken[i] = now
        self.outstanding[kind] -= len(picked)

    def pop_inputs(self, picked: Sequence[Completion]) -> SentInputs:
        """The inputs kept for the results ``picked`` (batch and row), forgotten here: the
        batch itself when they are all its rows, in order."""
        return self.pop_inputs_of([c.env_index for c in picked])

    def pop_inputs_of(self, indices: Sequence[int]) -> SentInputs:
        """:meth:`pop_inputs` of the results of the envs ``indices``."""
        inputs, rows = self.inputs, self.input_rows
        first = inputs[indices[0]]
        for row, i in enumerate(indices):
            if inputs[i] is not first or rows[i] != row:
                break
        else:
            assert first is not None
            if first.batch_size[0] == len(indices):
                for i in indices:
                    inputs[i] = None
                return first
        popped: list[Inputs] = []
        for i in indices:
            td = inputs[i]
            assert td is not None
            popped.append((td, rows[i]))
            inputs[i] = None
        return popped

    def drop(self, i: int) -> None:
        """Drop env ``i``'s ready result unreceived (its caller gave up)."""
        c = self.ready.pop(i)
        self.outstanding[c.kind] -= 1
        self.inputs[i] = None
        self.taken_at[i] = 0.0  # nobody took it: no wait for the caller to measure
        self.losses += 1
        if c.error is not None:
            self.failed_ready -= 1

    def clear(self) -> None:
        """Forget every state, ready result and input (the pool closed)."""
        self.states[:] = [EnvState.VOID] * self.num_envs
        self.ready.clear()
        self.failed_ready = 0
        self.losses += 1
        self.inputs[:] = [None] * self.num_envs

    # -- answers to calls ------------------------------------------------------------

    def answered(self, indices: Sequence[int]) -> bool:
        """Whether every env of ``indices`` has its answer in."""
        answers = self.answers
        return all(i in answers for i in indices)

    def pop_answers(self, indices: Sequence[int]) -> list[Completion]:
        """The answers of ``indices`` (all in), forgotten here."""
        return [self.answers.pop(i) for i in indices]

    def orphan(self, indices: Sequence[int]) -> None:
        """The caller waiting for the answers of ``indices`` is gone: drop those still due."""
        for i in indices:
            if self.answers.pop(i, None) is None:
                self.orphans.add(i)

    # -- what the restart supervisor asks -----------------------------------------------

    def is_free(self, i: int) -> bool:
        """Whether env ``i`` has no command in flight."""
        return self.pending[i] is None

    def mark_rebuilt(self, i: int) -> None:
        """Env ``i`` was rebuilt: INIT, unless a command went to it meanwhile."""
        if self.pending[i] is None:
            self.states[i] = EnvState.INIT

    def mark_broken(self, i: int) -> None:
        """Env ``i`` is past its restart budget: ERROR for good."""
        self.states[i] = _ERROR

    # -- statistics ------------------------------------------------------------------

    def latency_means(self) -> list[float]:
        """Mean seconds from send to completion of each env's steps (0 before its first)."""
        return [s / n if n else 0.0 for s, n in zip(self.latency_sum, self.steps, strict=True)]

    def in_flight_envs(self) -> list[int]:
        """The envs with a command in flight."""
        return [i for i, kind in enumerate(self.pending) if kind is not None]

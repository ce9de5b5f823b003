"""The pool's slot table and abandoned commands, driven directly: no executor, no event loop."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from aenvs import EnvBusyError, EnvError, EnvTimeoutError
from aenvs._commands import CommandKind, Completion, RemoteError
from aenvs._env import EnvState
from aenvs._pool.abandoned import AbandonedCommands
from aenvs._pool.slots import SlotTable

STEP, RESET, SMR, CALL = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET, CommandKind.CALL


def failed(i: int, kind: CommandKind) -> Completion:
    return Completion(i, kind, error=RemoteError("builtins.RuntimeError", "RuntimeError: boom\n"))


def test_sending_marks_envs_busy_and_counts_transitions_only() -> None:
    table = SlotTable(4)
    table.sent(STEP, [0, 2], now=1.0)
    table.sent(CALL, [1], now=2.0)
    assert table.pending == [STEP, CALL, STEP, None]
    assert table.sent_at == [1.0, 2.0, 1.0, 0.0]
    assert table.in_flight == 3
    assert table.outstanding[STEP] == 2 and table.outstanding[CALL] == 0
    assert table.in_flight_envs() == [0, 1, 2]
    assert [table.is_free(i) for i in range(4)] == [False, False, False, True]
    table.check_free([3])
    with pytest.raises(EnvBusyError) as busy:
        table.check_free([3, 2])
    assert busy.value.env_index == 2


def test_an_env_stays_busy_until_its_result_is_consumed() -> None:
    table = SlotTable(2)
    table.sent(STEP, [0], now=0.0)
    table.record([Completion(0, STEP)], now=0.25)
    assert table.pending[0] is None and table.in_flight == 0
    with pytest.raises(EnvBusyError):  # its result waits to be received
        table.check_free([0])
    picked = table.take(STEP, None, None)
    with pytest.raises(EnvBusyError):  # taken, not yet consumed
        table.check_free([0])
    table.consume(STEP, picked)
    table.check_free([0])
    assert table.ready == {} and table.outstanding[STEP] == 0


def test_recording_steps_sets_states_and_latencies() -> None:
    table = SlotTable(3)
    table.sent(STEP, [0, 1], now=1.0)
    table.sent(SMR, [2], now=2.0)
    table.record(
        [Completion(0, STEP), Completion(1, STEP, done=True), Completion(2, SMR, done=True, was_reset=True)],
        now=4.0,
    )
    assert table.states == [EnvState.RUN, EnvState.DONE, EnvState.RUN]  # a reset episode runs on
    assert table.steps == [1, 1, 1]
    assert table.latency_last == [3.0, 3.0, 2.0]
    table.consume(STEP, table.take(STEP, None, None))
    table.sent(STEP, [0], now=5.0)
    table.record([Completion(0, STEP)], now=6.0)
    assert table.steps[0] == 2
    assert table.latency_means() == [2.0, 3.0, 2.0]


def test_a_reset_runs_the_env_without_counting_a_step() -> None:
    table = SlotTable(1)
    table.mark([0], EnvState.RESET)
    table.sent(RESET, [0], now=0.0)
    table.record([Completion(0, RESET)], now=1.0)
    assert table.states == [EnvState.RUN]
    assert table.steps == [0] and table.latency_means() == [0.0]
    assert list(table.ready) == [0]


def test_a_failure_is_an_error_state_counted_and_handed_to_on_failure() -> None:
    seen: list[int] = []
    table = SlotTable(2, "inline", on_failure=lambda c: seen.append(c.env_index))
    table.sent(STEP, [0, 1], now=0.0)
    table.record([failed(1, STEP), Completion(0, STEP)], now=1.0)
    assert seen == [1]
    assert table.states == [EnvState.RUN, EnvState.ERROR]
    assert table.errors == [0, 1]


def test_on_failure_may_rename_the_error() -> None:
    def timed_out(c: Completion) -> None:
        c.error = RemoteError.timed_out("too slow")

    table = SlotTable(1, on_failure=timed_out)
    table.sent(STEP, [0], now=0.0)
    table.record([Completion(0, STEP, error=RemoteError.worker_died("killed"))], now=1.0)
    with pytest.raises(EnvTimeoutError):
        table.take(STEP, None, None)


def test_vet_sees_successful_transitions_only_and_may_fail_them() -> None:
    vetted: list[tuple[int, CommandKind]] = []

    def vet(c: Completion) -> None:
        vetted.append((c.env_index, c.kind))
        if c.env_index == 1:
            c.error = RemoteError("builtins.ValueError", "ValueError: nan\n")

    table = SlotTable(4, vet=vet)
    table.sent(STEP, [0, 1], now=0.0)
    table.sent(CALL, [2], now=0.0)
    table.sent(RESET, [3], now=0.0)
    table.record([Completion(0, STEP), Completion(1, STEP), Completion(2, CALL), failed(3, RESET)], now=1.0)
    assert vetted == [(0, STEP), (1, STEP)]
    assert table.states[:2] == [EnvState.RUN, EnvState.ERROR]
    assert table.errors == [0, 1, 0, 1]


def test_a_completion_nobody_waits_for_is_ignored() -> None:
    table = SlotTable(2)
    table.sent(STEP, [0], now=0.0)
    table.record([Completion(1, STEP)], now=1.0)  # env 1 has nothing in flight (closed meanwhile)
    assert table.ready == {} and table.in_flight == 1 and table.steps == [0, 0]


def test_take_filters_by_kind_and_honours_wanted_order_and_max_get() -> None:
    table = SlotTable(4)
    table.sent(STEP, [0, 1, 3], now=0.0)
    table.sent(RESET, [2], now=0.0)
    table.record(
        [Completion(3, STEP), Completion(0, STEP), Completion(2, RESET), Completion(1, STEP)], now=1.0
    )
    assert [c.env_index for c in table.take(STEP, None, None)] == [3, 0, 1]  # arrival order
    assert [c.env_index for c in table.take(STEP, None, 2)] == [3, 0]
    assert [c.env_index for c in table.take(STEP, [1, 3], None)] == [1, 3]
    assert [c.env_index for c in table.take(STEP, [2, 0], None)] == [0]  # env 2's is a reset
    assert [c.env_index for c in table.take(RESET, None, None)] == [2]
    assert len(table.ready) == 4 and table.outstanding[STEP] == 3  # nothing consumed


def test_take_raises_the_first_error_and_consumes_only_that_result() -> None:
    table = SlotTable(3, "thread")
    table.sent(STEP, [0, 1, 2], now=0.0)
    table.keep_inputs(TensorDict({"action": torch.zeros(3)}, [3]), [0, 1, 2])
    table.record([Completion(0, STEP), failed(1, STEP), Completion(2, STEP)], now=1.0)
    with pytest.raises(EnvError) as error:
        table.take(STEP, None, None)
    assert (error.value.env_index, error.value.command, error.value.executor) == (1, "step", "thread")
    assert sorted(table.ready) == [0, 2]
    assert table.outstanding[STEP] == 2
    assert table.inputs[1] is None and table.inputs[0] is not None
    table.check_free([1])  # its failure was received: it is free for a reset
    assert [c.env_index for c in table.take(STEP, None, None)] == [0, 2]


def test_take_unheld_leaves_held_envs_and_stops_at_the_limit() -> None:
    table = SlotTable(4)
    table.sent(STEP, [0, 1, 2, 3], now=0.0)
    table.record([Completion(i, STEP) for i in range(4)], now=1.0)
    assert [c.env_index for c in table.take_unheld(STEP, 10, {1, 2})] == [0, 3]
    assert [c.env_index for c in table.take_unheld(STEP, 1, {0})] == [1]
    assert table.take_unheld(STEP, 0, set()) == []
    assert table.take_unheld(RESET, 4, set()) == []


def _two_rows_sent_and_answered() -> tuple[SlotTable, TensorDict]:
    """A table of 3 envs whose envs 2 and 0 were sent a batch (rows 0 and 1) and answered."""
    table = SlotTable(3)
    batch = TensorDict({"action": torch.tensor([5, 6])}, [2])
    table.keep_inputs(batch, [2, 0])
    table.sent(STEP, [2, 0], now=0.0)
    table.record([Completion(0, STEP), Completion(2, STEP)], now=1.0)
    return table, batch


def test_inputs_are_kept_by_row_and_popped_with_the_results() -> None:
    table, batch = _two_rows_sent_and_answered()
    picked = table.take(STEP, [0, 2], None)  # not in the order they were sent
    table.consume(STEP, picked)
    popped = table.pop_inputs(picked)
    assert isinstance(popped, list)
    assert [(td is batch, row) for td, row in popped] == [(True, 1), (True, 0)]
    assert table.inputs == [None, None, None]


def test_results_that_are_every_row_of_their_batch_in_order_pop_that_batch() -> None:
    table, batch = _two_rows_sent_and_answered()
    picked = table.take(STEP, [2, 0], None)  # both, in the order of the batch: the batch
    table.consume(STEP, picked)
    assert table.pop_inputs(picked) is batch
    assert table.inputs == [None, None, None]
    table.keep_inputs(batch, [2, 0])
    table.sent(STEP, [2, 0], now=2.0)
    table.record([Completion(0, STEP), Completion(2, STEP)], now=3.0)
    picked = table.take(STEP, [2], None)  # one row of it: that row
    table.consume(STEP, picked)
    assert table.pop_inputs(picked) == [(batch, 0)]


def test_check_due_names_an_env_with_nothing_of_that_kind() -> None:
    table = SlotTable(3)
    table.sent(STEP, [0], now=0.0)
    table.sent(RESET, [1], now=0.0)
    table.record([Completion(1, RESET)], now=1.0)
    table.check_due(STEP, [0])
    table.check_due(RESET, [1])
    with pytest.raises(ValueError, match="env 1 has no step"):
        table.check_due(STEP, [0, 1])
    with pytest.raises(ValueError, match="env 2 has no reset"):
        table.check_due(RESET, [2])


def test_answers_wait_apart_from_results_and_orphans_are_dropped() -> None:
    table = SlotTable(3)
    table.sent(CALL, [0, 1, 2], now=0.0)
    table.record([Completion(0, CALL, value="a")], now=1.0)
    assert table.ready == {} and table.answered([0]) and not table.answered([0, 1])
    table.orphan([0, 1])  # the caller was cancelled: 0's answer goes now, 1's on arrival
    assert table.answers == {} and table.orphans == {1}
    with pytest.raises(EnvBusyError):
        table.check_free([1])
    table.record([Completion(1, CALL, value="b"), Completion(2, CALL, value="c")], now=2.0)
    assert table.orphans == set() and list(table.answers) == [2]
    assert [c.value for c in table.pop_answers([2])] == ["c"]
    table.check_free([0, 1, 2])


def test_stuck_names_envs_still_running_that_very_command() -> None:
    table = SlotTable(3)
    table.sent(STEP, [0, 1], now=1.0)
    table.sent(STEP, [2], now=2.0)
    table.record([Completion(1, STEP)], now=3.0)
    assert table.stuck([0, 1, 2], sent_at=1.0) == [0]
    assert table.stuck([0, 1, 2], sent_at=2.0) == [2]


def test_restart_marks_leave_an_env_with_a_new_command_alone() -> None:
    table = SlotTable(2)
    table.sent(RESET, [1], now=0.0)
    table.mark_rebuilt(0)
    table.mark_rebuilt(1)
    assert table.states == [EnvState.INIT, EnvState.VOID]
    table.mark_broken(1)
    assert table.states[1] is EnvState.ERROR


def test_drop_and_clear_forget_results() -> None:
    table = SlotTable(2)
    table.mark([0, 1], EnvState.INIT)
    table.sent(STEP, [0, 1], now=0.0)
    table.keep_inputs(TensorDict({}, [2]), [0, 1])
    table.record([Completion(0, STEP), Completion(1, STEP)], now=1.0)
    table.drop(0)
    assert list(table.ready) == [1] and table.outstanding[STEP] == 1 and table.inputs[0] is None
    table.clear()
    assert table.ready == {} and table.inputs == [None, None]
    assert table.states == [EnvState.VOID, EnvState.VOID]


def _abandoned(table: SlotTable, closed: bool = False) -> tuple[AbandonedCommands, list[str]]:
    calls: list[str] = []

    async def wait_ready() -> None:
        raise AssertionError("not awaited in these tests")

    abandoned = AbandonedCommands(
        table,
        drain=lambda: calls.append("drain"),
        wait_ready=wait_ready,
        dropped=lambda: calls.append("dropped"),
        closed=lambda: closed,
    )
    return abandoned, calls


def test_abandoned_results_are_dropped_on_arrival() -> None:
    table = SlotTable(3)
    table.sent(STEP, [0, 1, 2], now=1.0)
    abandoned, calls = _abandoned(table)
    abandoned.abandon(STEP, [0, 1])
    assert calls == ["drain"] and set(abandoned.commands) == {0, 1}
    table.record([Completion(0, STEP), Completion(2, STEP)], now=2.0)
    assert abandoned.discard()  # env 1's is still due
    assert list(table.ready) == [2] and table.outstanding[STEP] == 2
    assert calls == ["drain", "drain", "dropped"]
    table.record([Completion(1, STEP)], now=3.0)
    assert not abandoned.discard()
    assert list(table.ready) == [2] and not abandoned


def test_an_abandoned_command_received_or_superseded_is_forgotten() -> None:
    table = SlotTable(2)
    table.sent(STEP, [0, 1], now=1.0)
    abandoned, _ = _abandoned(table)
    abandoned.abandon(STEP, [0, 1], drop_now=False)
    table.record([Completion(0, STEP), Completion(1, STEP)], now=2.0)
    table.consume(STEP, table.take(STEP, [0], None))  # someone received env 0's result
    table.consume(STEP, table.take(STEP, [1], None))
    table.sent(RESET, [1], now=3.0)  # ... and sent env 1 a newer command
    assert not abandoned.discard()
    assert table.pending[1] is RESET and not abandoned


def test_give_up_abandons_on_cancel_keeps_results_on_env_error_and_ignores_others() -> None:
    table = SlotTable(2)
    table.sent(STEP, [0, 1], now=1.0)
    table.record([Completion(0, STEP)], now=2.0)
    abandoned, _ = _abandoned(table)
    abandoned.give_up(ValueError("bad input"), STEP, [0, 1])
    assert not abandoned
    abandoned.give_up(EnvError(1, "step"), STEP, [0, 1])
    assert set(abandoned.commands) == {0, 1} and list(table.ready) == [0]  # kept for a recv
    abandoned.give_up(KeyboardInterrupt(), STEP, [0, 1])
    assert table.ready == {} and set(abandoned.commands) == {1}


def test_a_closed_pool_forgets_abandoned_commands() -> None:
    table = SlotTable(1)
    table.sent(STEP, [0], now=1.0)
    abandoned, calls = _abandoned(table, closed=True)
    abandoned.abandon(STEP, [0])
    assert not abandoned and calls == []


def table_state(table: SlotTable) -> tuple[object, ...]:
    return (
        table.pending,
        table.states,
        table.sent_at,
        table.taken_at,
        table.steps,
        table.latency_sum,
        table.latency_last,
        table.in_flight,
        {kind: count for kind, count in table.outstanding.items() if count},
        table.env_latency.counts,
        table.policy_wait.counts,
        table.env_latency.ring.tobytes(),
        table.policy_wait.ring.tobytes(),
    )


def test_whole_batches_by_column_record_what_env_by_env_records() -> None:
    """A pool of 16 envs records whole batches a column at a time; the same batches recorded
    env by env (the column path turned off) leave every field the same, also after a batch
    that left the envs' sample counts apart (where the column path steps aside)."""
    n = 16
    every = list(range(n))
    by_column, by_env = SlotTable(n), SlotTable(n)
    by_env._by_column = False  # pyright: ignore[reportPrivateUsage]
    assert by_column._by_column  # pyright: ignore[reportPrivateUsage]
    columns = by_column.policy_wait.add_to_all, by_column.env_latency.add_to_all
    taken: list[bool] = []  # whether each batch's samples went in a column at a time

    def counted(add: Any) -> Any:
        def add_to_all(seconds: float) -> bool:
            taken.append(add(seconds))
            return taken[-1]

        return add_to_all

    by_column.policy_wait.add_to_all, by_column.env_latency.add_to_all = map(counted, columns)
    no = bytes(n)
    ended = bytes(1 if i in (3, 7) else 0 for i in range(n))
    reset = bytes(1 if i == 3 else 0 for i in range(n))  # env 7's episode ended without a reset
    batches = [
        (RESET, no, no),
        (SMR, no, no),
        (SMR, ended, ended),
        (SMR, no, no),
        (STEP, ended, reset),
    ]
    now = 1.0
    for t, (kind, done, was_reset) in enumerate(batches):
        for table in (by_column, by_env):
            table.sent(kind, every, now)
            table.complete_whole(kind, (kind, every, done, was_reset), now + 0.25 + t / 64)
        assert table_state(by_column) == table_state(by_env), (t, kind)
        now += 1.0
    assert taken == [True] * (2 * len(batches) - 1)  # the reset's send has no policy wait
    assert by_column.states[7] is EnvState.DONE and by_column.states[3] is EnvState.RUN
    assert by_column.steps == [len(batches) - 1] * n
    for table in (by_column, by_env):  # counts apart: env 0 alone stepped once more
        table.sent(STEP, [0], now)
        table.record([Completion(0, STEP)], now + 0.5)
        table.consume(STEP, [table.ready[0]])
        table.sent(STEP, every, now + 1.0)
        table.complete_whole(STEP, (STEP, every, no, no), now + 1.5)
    assert table_state(by_column) == table_state(by_env)
    assert taken[-1] is False  # env 0 a sample ahead: that batch went env by env
    assert by_column.steps[0] == by_column.steps[1] + 1


@pytest.mark.parametrize("n", [4, 16])
def test_a_batch_run_where_it_is_sent_records_what_a_send_and_answer_record(n: int) -> None:
    """``ran_whole`` (the inline executor's whole batch, run in the sender's call) leaves the
    table as ``sent`` then ``complete_whole`` do, env by env and by column."""
    every = list(range(n))
    apart, together = SlotTable(n), SlotTable(n)
    no = bytes(n)
    ended = bytes(1 if i == 1 else 0 for i in range(n))
    batches = [(RESET, no, no), (SMR, no, no), (SMR, ended, ended), (STEP, no, no), (STEP, ended, no)]
    now = 1.0
    for kind, done, was_reset in batches:
        apart.sent(kind, every, now)
        apart.complete_whole(kind, (kind, every, done, was_reset), now + 0.125)
        together.ran_whole(kind, (kind, every, done, was_reset), now, now + 0.125)
        assert table_state(together) == table_state(apart), kind
        now += 1.0
    assert together.states[1] is EnvState.DONE
    assert together.steps == [len(batches) - 1] * n
    assert together.policy_wait.counts == [len(batches) - 1] * n

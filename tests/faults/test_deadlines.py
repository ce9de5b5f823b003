"""Episode deadlines and timeouts that end an episode as truncated, on every executor.

A hung step outlives ``step_timeout`` or ``episode_timeout``: with ``on_timeout="truncate"``
its env's result is a truncated end of episode flagged ``timed_out`` (its last observation,
reward 0), the env is rebuilt and steps again after a reset; with ``"raise"`` it is an
EnvTimeoutError. A step sent after its episode's deadline is never run. Every send is
matched by exactly one result.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import AsyncEnvPool, EnvTimeoutError, step_mdp
from aenvs._commands import Completion
from tests.faults.deadline_envs import hanging_env_fns
from tests.faults.support import WAIT, collect

pytestmark = pytest.mark.timeout(90)

STEP_TIMEOUT = 0.3
EPISODE_TIMEOUT = 0.5  # long enough for the steps before the hung one, on a loaded machine


def actions(n: int, env_index: list[int] | None = None) -> TensorDict:
    td = TensorDict(action=torch.ones(n, dtype=torch.long), batch_size=[n])
    if env_index is not None:
        td["env_index"] = torch.tensor(env_index)
    return td


def column(out: TensorDictBase, key: str) -> list[object]:
    return out["next", key].flatten().tolist()


async def past_deadline(since: float, seconds: float) -> None:
    """Wait until ``seconds`` have passed since ``since`` (a deadline under test must pass)."""
    # the clock itself is awaited, not an event: a loop's timer may fire a millisecond early
    while (left := since + seconds - time.perf_counter()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(left)


async def nothing_left(pool: AsyncEnvPool) -> None:
    """No result is due or ready any more: each send had exactly one."""
    with pytest.raises(ValueError, match="would wait forever"):
        await pool.async_step_recv(min_get=1)
    with pytest.raises(ValueError, match="would wait forever"):
        await pool.async_step_and_maybe_reset_recv(min_get=1)


@pytest.mark.parametrize("deadline", ["step_timeout", "episode_timeout"])
async def test_a_hung_step_ends_its_episode_as_truncated(
    make_pool, executor: str, deadline: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    fns = hanging_env_fns(3, {1: 3}, str(release), asynchronous=executor == "inline")
    limit = {"step_timeout": STEP_TIMEOUT, "episode_timeout": EPISODE_TIMEOUT}[deadline]
    pool = await make_pool(fns, envs_per_worker=1, on_timeout="truncate", **{deadline: limit})
    try:
        await pool.reset()
        for _ in range(2):
            assert column(await pool.step(actions(3)), "timed_out") == [False] * 3
        await pool.async_step_send(actions(3))
        out = await pool.async_step_recv(min_get=3, timeout=WAIT)
        assert out["env_index"].tolist() == [0, 1, 2]
        assert column(out, "timed_out") == [False, True, False]
        assert column(out, "truncated") == [False, True, False]
        assert column(out, "done") == [False, True, False]
        assert column(out, "terminated") == [False] * 3
        assert column(out, "reward") == [1.0, 0.0, 1.0]
        # env 1's observation is the one its hung step started from
        assert column(out, "position") == [3.0, 2.0, 3.0]
        assert out["next", "text"] == ["0:3", "1:2", "2:3"]
        await nothing_left(pool)
        # its worker was stopped: the env was rebuilt, and steps again after a reset
        await pool.reset()
        out = await pool.step(actions(3))
        assert column(out, "position") == [1.0, 1.0, 1.0]
        assert column(out, "timed_out") == [False] * 3
        assert await pool.get_attr("steps_seen") == [4, 1, 4]
        assert pool.stats().timeouts == [0, 1, 0]
        assert pool.stats().restarts == [0, 1, 0]
    finally:
        release.touch()  # an abandoned thread can end now


async def test_a_hung_step_past_the_episode_deadline_raises(make_pool, executor: str, tmp_path: Path) -> None:
    release = tmp_path / "release"
    fns = hanging_env_fns(3, {1: 2}, str(release), asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1, episode_timeout=EPISODE_TIMEOUT)
    try:
        await pool.reset()
        await pool.step(actions(3))
        await pool.async_step_send(actions(3))
        results, errors = await collect(pool, 3)
        assert results["env_index"].tolist() == [0, 2]
        assert column(results, "position") == [2.0, 2.0]
        assert "timed_out" not in results["next"].keys()  # only with on_timeout="truncate"
        assert [type(e) for e in errors] == [EnvTimeoutError]
        assert errors[0].env_index == 1 and errors[0].command == "step"
        assert f"env 1's episode outlived episode_timeout={EPISODE_TIMEOUT} s" in str(errors[0])
        assert pool.stats().timeouts == [0, 1, 0]
        await nothing_left(pool)
    finally:
        release.touch()


@pytest.mark.parametrize("on_timeout", ["raise", "truncate"])
async def test_a_step_sent_after_the_episode_deadline_is_not_run(
    make_pool, executor: str, on_timeout: str
) -> None:
    fns = hanging_env_fns(3, {}, "", asynchronous=False)
    pool = await make_pool(fns, envs_per_worker=1, episode_timeout=EPISODE_TIMEOUT, on_timeout=on_timeout)
    await pool.reset()
    since = time.perf_counter()
    td = step_mdp(await pool.step(actions(3)))
    await past_deadline(since, EPISODE_TIMEOUT)  # every episode is over while the envs wait for the caller
    await pool.reset(env_index=[1])  # env 1 starts a new one
    if on_timeout == "raise":
        await pool.async_step_send(actions(2, env_index=[0, 1]))
        results, errors = await collect(pool, 2)
        assert results["env_index"].tolist() == [1]
        assert [type(e) for e in errors] == [EnvTimeoutError]
        assert errors[0].env_index == 0
        assert "before this step was sent; it was not run" in str(errors[0])
    else:  # a partial step: env 0 is over, env 1 steps, env 2 is not stepped
        td["action"] = torch.ones(3, dtype=torch.long)
        td["_step"] = torch.tensor([True, True, False])
        out = await pool.step(td)
        assert isinstance(out, TensorDict)  # dense, flags and all
        assert column(out, "timed_out") == [True, False, False]
        assert column(out, "truncated") == [True, False, False]
        assert column(out, "position") == [1.0, 1.0, 1.0]
        assert out["next", "text"] == ["0:1", "1:1", "2:1"]
    await nothing_left(pool)
    assert await pool.get_attr("steps_seen") == [1, 2, 1]  # env 0 never saw its step
    assert pool.stats().timeouts == [1, 0, 0]
    assert pool.stats().restarts == [0, 0, 0]  # nothing was stopped: nothing to rebuild
    if on_timeout == "truncate":  # rollouts carry the flag too
        traj = await pool.rollout(2, break_when_any_done=False)
        assert traj["next", "timed_out"].shape == (3, 2, 1)


@pytest.mark.parametrize("when", ["in_flight", "after_deadline"])
async def test_step_and_maybe_reset_resets_the_env_it_truncated(
    make_pool, executor: str, when: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    hang = {1: 2} if when == "in_flight" else {}
    fns = hanging_env_fns(2, hang, str(release), asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1, episode_timeout=EPISODE_TIMEOUT, on_timeout="truncate")
    try:
        td = await pool.reset()
        since = time.perf_counter()
        td["action"] = torch.ones(2, dtype=torch.long)
        _, td = await pool.step_and_maybe_reset(td)
        late = [1] if when == "in_flight" else [0, 1]
        if when == "after_deadline":
            await past_deadline(since, EPISODE_TIMEOUT)
        td["action"] = torch.ones(2, dtype=torch.long)
        out, td = await asyncio.wait_for(pool.step_and_maybe_reset(td), WAIT)
        assert column(out, "timed_out") == [i in late for i in range(2)]
        assert column(out, "position") == [1.0 if i in late else 2.0 for i in range(2)]
        assert out["next", "text"] == [f"{i}:1" if i in late else f"{i}:2" for i in range(2)]
        # next_td: the new episode's first observation where the episode was cut
        assert td["position"].flatten().tolist() == [0.0 if i in late else 2.0 for i in range(2)]
        assert td["text"] == [f"{i}:0" if i in late else f"{i}:2" for i in range(2)]
        assert td["done"].flatten().tolist() == [False, False]
        await nothing_left(pool)
        await past_deadline(since, EPISODE_TIMEOUT)  # env 0's first episode is over in any case
        td["action"] = torch.ones(2, dtype=torch.long)
        out, _ = await pool.step_and_maybe_reset(td)
        if when == "in_flight":  # env 0's episode, begun with env 1's, ends now; env 1's new one goes on
            assert column(out, "timed_out") == [True, False]
            assert column(out, "position") == [2.0, 1.0]
            assert pool.stats().restarts == [0, 1]  # env 1's step was stopped: rebuilt
            assert await pool.get_attr("steps_seen") == [2, 1]
        else:  # both envs began new episodes; their steps after the deadline were never sent
            assert column(out, "timed_out") == [False, False]
            assert column(out, "position") == [1.0, 1.0]
            assert pool.stats().restarts == [0, 0]
            assert await pool.get_attr("steps_seen") == [2, 2]
        assert pool.stats().timeouts == [1, 1]
    finally:
        release.touch()


def stop_as_it_answers(pool: AsyncEnvPool, release: Path) -> list[int]:
    """Make the pool's stops of hung steps come as those steps finish: each stop releases
    them first and, on the thread executor, waits until their worker has answered (the
    answer queued for the loop, not yet delivered), which is the race of a step that
    returns just as its deadline passes. Returns the envs whose answer beat their stop."""
    executor = pool.executor
    abort, push = executor.abort, executor._push_threadsafe  # pyright: ignore[reportPrivateUsage]
    stopping: set[int] = set()
    answered = threading.Event()
    beaten: list[int] = []

    def push_and_tell(completions: Sequence[Completion]) -> None:  # on the worker's thread
        push(completions)
        if any(c.env_index in stopping for c in completions):
            answered.set()

    def answer_then_abort(indices: Sequence[int]) -> None:
        stopping.update(indices)
        release.touch()
        # the other executors cannot deliver an answer while the loop runs this: the stop wins
        if executor.name == "thread":
            assert answered.wait(WAIT), "the released step did not answer"
            beaten.extend(indices)
        abort(indices)

    executor.abort = answer_then_abort  # pyright: ignore[reportAttributeAccessIssue]
    executor._push_threadsafe = push_and_tell  # pyright: ignore[reportAttributeAccessIssue]
    return beaten


async def test_a_step_finishing_as_its_deadline_stops_it_is_truncated(
    make_pool, executor: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    fns = hanging_env_fns(2, {1: 2}, str(release), asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1, step_timeout=STEP_TIMEOUT, on_timeout="truncate")
    beaten = stop_as_it_answers(pool, release)
    td = await pool.reset()
    td["action"] = torch.ones(2, dtype=torch.long)
    _, td = await pool.step_and_maybe_reset(td)
    td["action"] = torch.ones(2, dtype=torch.long)
    # env 1's second step hangs until its deadline stops it, and answers just then
    out, td = await asyncio.wait_for(pool.step_and_maybe_reset(td), WAIT)
    assert beaten == ([1] if executor == "thread" else [])
    assert column(out, "timed_out") == [False, True]
    assert column(out, "position") == [2.0, 1.0]  # env 1: the observation its step started from
    assert out["next", "text"] == ["0:2", "1:1"]
    assert td["position"].flatten().tolist() == [2.0, 0.0]  # env 1 was rebuilt and reset
    await nothing_left(pool)
    td["action"] = torch.ones(2, dtype=torch.long)
    out, _ = await asyncio.wait_for(pool.step_and_maybe_reset(td), WAIT)
    assert column(out, "position") == [3.0, 1.0] and column(out, "timed_out") == [False, False]
    stats = pool.stats()
    assert (stats.timeouts, stats.restarts, stats.errors) == ([0, 1], [0, 1], [0, 0])


async def test_a_step_finishing_as_its_deadline_stops_it_raises(
    make_pool, executor: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    fns = hanging_env_fns(2, {1: 2}, str(release), asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1, episode_timeout=EPISODE_TIMEOUT)
    beaten = stop_as_it_answers(pool, release)
    await pool.reset()
    await pool.step(actions(2))
    await pool.async_step_send(actions(2))
    results, errors = await collect(pool, 2)
    assert beaten == ([1] if executor == "thread" else [])
    assert results["env_index"].tolist() == [0]
    assert [(type(e), e.env_index) for e in errors] == [(EnvTimeoutError, 1)]
    assert f"env 1's episode outlived episode_timeout={EPISODE_TIMEOUT} s during its step" in str(errors[0])
    assert pool.stats().timeouts == [0, 1]
    await nothing_left(pool)


def test_bad_deadline_options_are_refused() -> None:
    with pytest.raises(ValueError, match="on_timeout must be 'raise' or 'truncate', got 'skip'"):
        AsyncEnvPool("CartPole-v1", num_envs=1, on_timeout="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="episode_timeout must be >= 0"):
        AsyncEnvPool("CartPole-v1", num_envs=1, episode_timeout=-1.0)

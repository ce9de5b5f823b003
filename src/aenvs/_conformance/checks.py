"""The checks: one coroutine per behaviour, each given a :class:`Run` of its own."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from tensordict import TensorDictBase

from aenvs import EnvBusyError, EnvCrashedError, EnvError, EnvTimeoutError, PoolClosedError
from aenvs._conformance.envs import InCallersProcess, ProbeFault, probe_env_fns
from aenvs._conformance.run import N, Run, Skipped, echo_actions, env_indices, first_column

if TYPE_CHECKING:
    from aenvs import AsyncEnvPool

STEP_TIMEOUT = 0.5  # seconds, for the timeout checks


async def _start_and_close(run: Run) -> None:
    a, b = run.new_executor(), run.new_executor()
    b.kill()
    run.expect(
        a is not b, "make_executor() returned the same instance twice: it must build a new one per call"
    )
    a.kill()
    pool = await run.pool(probe_env_fns())
    run.expect(pool.num_envs == N and len(pool.env_specs) == N, f"a pool of {N} envs has {pool.num_envs}")
    td = await run.bounded(pool.reset(), "reset")
    run.expect(env_indices(td) == list(range(N)), f"reset returned envs {env_indices(td)}")
    await run.bounded(pool.aclose(), "aclose", run.close_timeout + run.close_grace)
    run.expect(pool.is_closed, "the pool is not closed after aclose")
    await run.bounded(pool.aclose(), "a second aclose", run.close_grace)
    await run.raises(PoolClosedError, pool.reset(), "reset after aclose")
    await run.raises(PoolClosedError, pool.start(), "start after aclose")


async def _off_the_loop(run: Run) -> None:
    if run.capabilities().blocks_loop:
        raise Skipped("its capabilities declare blocks_loop: plain envs run on the event loop's thread")
    pool = await run.pool(probe_env_fns())
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.step(echo_actions([1.0] * N, range(N))), "step")
    ran_on = await run.bounded(pool.get_attr("ran_on"), "get_attr('ran_on')")
    here = (os.getpid(), threading.get_ident())
    on_loop = [i for i, places in enumerate(ran_on) if here in [tuple(place) for place in places]]
    run.expect(
        not on_loop,
        f"its capabilities declare blocks_loop=False, but envs {on_loop} reset or stepped on the "
        "event loop's thread (plain env code there stalls every other task of the program)",
    )


async def _kill_is_idempotent(run: Run) -> None:
    unstarted = run.new_executor()
    unstarted.kill()
    unstarted.kill()
    gate = run.gate()
    pool = await run.pool(probe_env_fns(True, faults={0: ProbeFault("hang", gate=gate)}))
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.async_step_send(echo_actions([1.0] * N, range(N))), "async_step_send")
    executor = pool.executor
    executor.kill()
    executor.kill()
    limit = run.close_timeout + run.close_grace
    await run.bounded(pool.aclose(), "aclose after kill() (env 0 still stepping)", limit)
    executor.kill()
    run.expect(pool.is_closed, "the pool is not closed after kill() and aclose")


async def _routing(run: Run, asynchronous: bool) -> None:
    pool = await run.pool(probe_env_fns(asynchronous, delay=(0.0, 0.003)))
    td = await run.bounded(pool.reset(), "reset")
    run.expect(
        env_indices(td) == list(range(N)) and first_column(td, "observation") == [float(i) for i in range(N)],
        f"reset: env_index {env_indices(td)} with observations of envs {first_column(td, 'observation')}",
    )
    td = await run.bounded(pool.reset(env_index=[2, 0]), "reset(env_index=[2, 0])")
    run.expect(
        env_indices(td) == [2, 0] and first_column(td, "observation") == [2.0, 0.0],
        f"reset(env_index=[2, 0]): env_index {env_indices(td)} with observations of envs "
        f"{first_column(td, 'observation')}",
    )
    for step in range(1, 4):
        order = run.rng.sample(range(N), N)
        cuts = sorted(run.rng.sample(range(1, N), run.rng.randint(0, N - 1)))
        groups = [order[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, N], strict=True)]
        action = {i: 100.0 * step + i for i in range(N)}
        for group in groups:
            await run.bounded(
                pool.async_step_send(echo_actions([action[i] for i in group], group)), f"sending envs {group}"
            )
        what = f"step {step} sent as {groups}"
        for i, row in (await run.results(pool, range(N), what)).items():
            run.echo(row, i, action[i], step, what)
    run.settled(pool, "routing")


async def _routing_plain(run: Run) -> None:
    await _routing(run, asynchronous=False)


async def _routing_async(run: Run) -> None:
    await _routing(run, asynchronous=True)


async def _send_returns_early(run: Run) -> None:
    gate = run.gate()
    pool = await run.pool(probe_env_fns(True, faults={i: ProbeFault("hang", gate=gate) for i in range(N)}))
    await run.bounded(pool.reset(), "reset")
    await run.bounded(
        pool.async_step_send(echo_actions([5.0] * N, range(N))),
        "async_step_send to envs whose steps wait for a gate (a send must return once the steps "
        "are dispatched, not when they finish)",
    )
    stats = pool.stats()
    run.expect(
        stats.in_flight == N and stats.ready == 0,
        f"right after the send, with every step waiting, {stats.in_flight} are in flight and {stats.ready} ready",
    )
    try:
        await run.bounded(pool.async_step_recv(min_get=1, timeout=0.2), "a receive with timeout=0.2")
    except TimeoutError:
        pass
    else:
        run.fail("async_step_recv(timeout=0.2) returned results although every step still waits")
    run.release(gate)
    for i, row in (await run.results(pool, range(N), "after the gate opened")).items():
        run.echo(row, i, 5.0, 1, "after a timed-out receive")
    run.settled(pool, "after a timed-out receive")


async def _receive_rules(run: Run) -> None:
    pool = await run.pool(probe_env_fns(delay=(0.0, 0.005)))
    await run.bounded(pool.reset(), "reset")
    action = {i: 10.0 + i for i in range(N)}
    every = list(range(N))
    await run.bounded(pool.async_step_send(echo_actions([action[i] for i in every], every)), "send")
    named = await run.bounded(pool.async_step_recv(env_index=[3, 1]), "async_step_recv(env_index=[3, 1])")
    run.expect(
        env_indices(named) == [3, 1], f"async_step_recv(env_index=[3, 1]) returned envs {env_indices(named)}"
    )
    one = await run.bounded(
        pool.async_step_recv(min_get=1, max_get=1), "async_step_recv(min_get=1, max_get=1)"
    )
    run.expect(one.batch_size[0] == 1, f"async_step_recv(max_get=1) returned {one.batch_size[0]} results")
    rest = await run.bounded(pool.async_step_recv(min_get=1), "async_step_recv(min_get=1)")
    got = env_indices(named) + env_indices(one) + env_indices(rest)
    run.expect(sorted(got) == every, f"three receives of one step of {N} envs returned envs {got}")
    for out in (named, one, rest):
        for k, i in enumerate(env_indices(out)):
            run.echo(out[k], i, action[i], 1, "receives by env_index, max_get and min_get")
    await run.raises(
        ValueError, pool.async_step_recv(), "a receive with nothing in flight (it would wait forever)"
    )
    await run.bounded(pool.async_step_send(echo_actions([action[i] for i in every], every)), "send")
    some = await run.bounded(pool.async_step_recv(min_get=3), "async_step_recv(min_get=3)")
    count = some.batch_size[0]
    run.expect(count >= 3, f"async_step_recv(min_get=3) returned {count} results")
    if count < N:
        late = await run.bounded(pool.async_step_recv(min_get=N - count), "receiving the rest")
        run.expect(
            sorted(env_indices(some) + env_indices(late)) == every,
            f"two receives returned envs {env_indices(some)} and {env_indices(late)}",
        )
    run.settled(pool, "receive rules")


async def _cancelled_receives(run: Run) -> None:
    half = N // 2
    pool = await run.pool(probe_env_fns([False] * half + [True] * (N - half), delay=(0.0, 0.0003)))
    await run.bounded(pool.reset(), "reset")
    sent = [0] * N
    received: list[list[int]] = [[] for _ in range(N)]

    def record(out: TensorDictBase) -> None:
        for i, observation in zip(env_indices(out), out["next", "observation"].tolist(), strict=True):
            received[i].append(int(observation[2]))

    idle = list(range(N))
    cancelled = rounds = 0
    while cancelled < run.cancellations:
        rounds += 1
        if idle:
            await run.bounded(
                pool.async_step_send(echo_actions([1.0] * len(idle), idle)), f"send to envs {idle}"
            )
            for i in idle:
                sent[i] += 1
        receive = run.start(pool.async_step_recv(min_get=run.rng.randint(1, N)))
        # cancelled at a random point: after a few loop turns, or after a moment in which
        # results may arrive (a race with the executor's answers)
        if run.rng.random() < 0.5:
            for _ in range(run.rng.randint(0, 3)):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(run.rng.uniform(0.0, 0.002))
        receive.cancel()
        try:
            record(await run.bounded(receive, f"a receive cancelled in round {rounds}"))
        except asyncio.CancelledError:
            cancelled += 1
        ready = pool.stats().ready
        if ready:
            record(await run.bounded(pool.async_step_recv(min_get=ready), f"receiving {ready} ready results"))
        idle = [i for i in range(N) if len(received[i]) == sent[i]]
    pending = sum(sent) - sum(len(r) for r in received)
    if pending:
        record(
            await run.bounded(pool.async_step_recv(min_get=pending), f"receiving the last {pending} results")
        )
    for i in range(N):
        expected = list(range(1, sent[i] + 1))
        if received[i] != expected:
            lost = sorted(set(expected) - set(received[i]))
            twice = sorted({s for s in received[i] if received[i].count(s) > 1})
            run.fail(
                f"after {cancelled} cancelled receives (seed {run.seed}), env {i} was sent {sent[i]} steps: "
                f"lost steps {lost[:10]}, duplicated steps {twice[:10]}"
            )
    run.settled(pool, f"after {cancelled} cancelled receives")


async def _env_error(run: Run) -> None:
    faults = {1: ProbeFault("raise"), 2: ProbeFault("raise")}
    pool = await run.pool(
        probe_env_fns([False, True, False, True], faults=faults)
    )  # env 1 async, env 2 plain
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.async_step_send(echo_actions([2.0] * N, range(N))), "send")
    results, errors = await run.answers(pool, range(N), "a step where envs 1 (async) and 2 (plain) raise")
    run.expect(sorted(errors) == [1, 2], f"EnvErrors for envs {sorted(errors)}, expected envs [1, 2]")
    for i, error in errors.items():
        run.expect(
            type(error) is EnvError and error.command == "step",
            f"env {i}'s exception surfaced as {type(error).__name__} for command {error.command!r}",
        )
        run.expect(
            f"env {i}" in str(error) and "InjectedFault" in error.remote_traceback,
            f"env {i}'s EnvError does not name the env or carry the original traceback: {error}",
        )
    for i, row in results.items():
        run.echo(row, i, 2.0, 1, "the other envs, beside the failing ones")
    td = await run.bounded(pool.reset(env_index=[1, 2]), "reset the failed envs")
    run.expect(env_indices(td) == [1, 2], f"reset(env_index=[1, 2]) returned envs {env_indices(td)}")
    out = await run.bounded(
        pool.step(echo_actions([3.0, 3.0], [1, 2])), "step the failed envs after their reset"
    )
    for k, i in enumerate(env_indices(out)):
        run.echo(out[k], i, 3.0, 1, "a failed env after its reset")
    run.settled(pool, "env errors")


async def _calls(run: Run) -> None:
    pool = await run.pool(probe_env_fns([False, True, False, True]))
    got = await run.bounded(pool.get_attr("env_index"), "get_attr('env_index')")
    run.expect(got == list(range(N)), f"get_attr('env_index') returned {got}")
    await run.bounded(pool.set_attr("label", 7, env_index=[0, 3]), "set_attr('label', 7, env_index=[0, 3])")
    got = await run.bounded(pool.get_attr("label"), "get_attr('label')")
    run.expect(
        got == [7, None, None, 7], f"after set_attr('label', 7, env_index=[0, 3]), get_attr returned {got}"
    )
    values = await run.bounded(
        pool.call("observe", 5.0, env_index=[1]), "call('observe', 5.0, env_index=[1])"
    )
    run.expect(
        len(values) == 1 and [float(x) for x in values[0].tolist()] == [1.0, 5.0, 0.0],
        f"call('observe', 5.0, env_index=[1]) returned {values}",
    )
    error = await run.raises(
        EnvError, pool.get_attr("no_such_attribute", env_index=[3]), "get_attr of a missing name"
    )
    run.expect(error.env_index == 3, f"the EnvError of get_attr on env 3 names env {error.env_index}")
    got = await run.bounded(pool.get_attr("env_index"), "get_attr after a failed one")
    run.expect(got == list(range(N)), f"get_attr('env_index') after a failed call returned {got}")
    run.settled(pool, "calls")


async def _busy_env(run: Run) -> None:
    gate = run.gate()
    pool = await run.pool(probe_env_fns(True, faults={1: ProbeFault("hang", gate=gate)}))
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.async_step_send(echo_actions([1.0], [1])), "send to env 1")
    error = await run.raises(
        EnvBusyError, pool.async_step_send(echo_actions([2.0], [1])), "a second send to env 1"
    )
    run.expect(error.env_index == 1, f"EnvBusyError names env {error.env_index}, not env 1")
    await run.raises(EnvBusyError, pool.call("observe", 0.0), "a call to every env while env 1 steps")
    run.release(gate)
    results = await run.results(pool, [1], "env 1's one step")
    run.echo(results[1], 1, 1.0, 1, "after a refused second send")
    got = await run.bounded(pool.get_attr("steps"), "get_attr('steps')")
    run.expect(got == [0, 1, 0, 0], f"after one step of env 1, get_attr('steps') returned {got}")
    run.settled(pool, "after a refused second send")


async def _close_in_flight(run: Run) -> None:
    gate = run.gate()
    fns = probe_env_fns([False, False, True, True], delay=0.05, faults={3: ProbeFault("hang", gate=gate)})
    pool = await run.pool(fns)
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.async_step_send(echo_actions([1.0] * N, range(N))), "send")
    waiting = run.start(pool.async_step_recv(env_index=[3]))
    await asyncio.sleep(0.01)
    limit = run.close_timeout + run.close_grace
    await run.bounded(pool.aclose(), f"aclose with {N} steps in flight (env 3's hung)", limit)
    run.expect(pool.is_closed, "the pool is not closed after aclose")
    try:
        await run.bounded(waiting, "the receive waiting for env 3 when the pool closed", run.close_grace)
    except PoolClosedError:
        pass
    else:
        run.fail("a receive waiting for env 3 (hung) returned results after the pool closed")
    await run.raises(PoolClosedError, pool.async_step_recv(), "a receive after aclose")
    await run.raises(PoolClosedError, pool.async_step_send(echo_actions([1.0], [0])), "a send after aclose")
    await run.bounded(pool.aclose(), "a second aclose", run.close_grace)


async def _restart_after_error(run: Run) -> None:
    pool = await run.pool(
        probe_env_fns(faults={1: ProbeFault("raise", at=2)}), on_error="restart", restart_backoff=0.0
    )
    await run.bounded(pool.reset(), "reset")
    out = await run.bounded(pool.step(echo_actions([1.0] * N, range(N))), "step 1")
    for k, i in enumerate(env_indices(out)):
        run.echo(out[k], i, 1.0, 1, "step 1")
    await run.bounded(pool.async_step_send(echo_actions([1.0] * N, range(N))), "send step 2")
    _, errors = await run.answers(pool, range(N), "step 2, where env 1 raises")
    run.expect(sorted(errors) == [1], f"EnvErrors for envs {sorted(errors)} at step 2, expected env 1's")
    await run.bounded(pool.reset(), "reset while env 1 is rebuilt (on_error='restart')")
    counts = await run.bounded(pool.get_attr("step_count", env_index=[1]), "get_attr on the rebuilt env")
    run.expect(counts == [0], f"env 1 was not rebuilt from its factory: its step_count is {counts[0]}, not 0")
    restarts = pool.stats().restarts
    run.expect(restarts == [0, 1, 0, 0], f"restarts per env are {restarts}, expected [0, 1, 0, 0]")
    out = await run.bounded(pool.step(echo_actions([2.0] * N, range(N))), "a step after the restart")
    for k, i in enumerate(env_indices(out)):
        run.echo(out[k], i, 2.0, 1, "a step after the restart")
    run.settled(pool, "after a restart")


async def _timed_out_pool(run: Run, on_error: Literal["raise", "restart"]) -> AsyncEnvPool:
    """A pool whose env 1 hangs in its second step; returned once that step timed out."""
    gate = run.gate()
    fns = probe_env_fns(True, faults={1: ProbeFault("hang", at=2, gate=gate)})
    pool = await run.pool(fns, step_timeout=STEP_TIMEOUT, on_error=on_error, restart_backoff=0.0)
    run.probe_abort(pool.executor)
    await run.bounded(pool.reset(), "reset")
    out = await run.bounded(pool.step(echo_actions([1.0] * N, range(N))), "step 1")
    for k, i in enumerate(env_indices(out)):
        run.echo(out[k], i, 1.0, 1, "step 1")
    await run.bounded(pool.async_step_send(echo_actions([1.0] * N, range(N))), "send step 2")
    what = f"step 2, where env 1 hangs past step_timeout={STEP_TIMEOUT}"
    results, errors = await run.answers(pool, range(N), what)
    run.expect(1 in errors, f"{what}: env 1 returned a result")
    run.expect(
        isinstance(errors[1], EnvTimeoutError),
        f"{what}: env 1's step surfaced as {type(errors[1]).__name__}, not EnvTimeoutError: {errors[1]}",
    )
    for i, other in errors.items():  # envs sharing env 1's worker share its fate
        run.expect(
            isinstance(other, EnvTimeoutError | EnvCrashedError),
            f"{what}: env {i} raised {type(other).__name__}: {other}",
        )
    for i, row in results.items():
        run.echo(row, i, 1.0, 2, what)
    timeouts = pool.stats().timeouts
    run.expect(
        timeouts[1] == 1 and all(count == 0 or i in errors for i, count in enumerate(timeouts)),
        f"{what}: timeouts per env are {timeouts}",
    )
    return pool


async def _step_timeout_aborts(run: Run) -> None:
    run.needs("abort")
    pool = await _timed_out_pool(run, "raise")
    executor = pool.executor
    run.expect(
        not executor.worker_alive(1),
        "after abort([1]) worker_alive(1) is still True: the pool would never replace the stopped worker",
    )
    await run.raises(EnvCrashedError, pool.reset(env_index=[1]), "reset env 1 after its worker was stopped")
    alive = [i for i in range(N) if executor.worker_alive(i)]
    if alive:  # the envs on other workers work on (one worker may host every env)
        td = await run.bounded(pool.reset(env_index=alive), f"reset envs {alive}")
        run.expect(env_indices(td) == alive, f"reset(env_index={alive}) returned envs {env_indices(td)}")
        out = await run.bounded(pool.step(echo_actions([3.0] * len(alive), alive)), f"a step of envs {alive}")
        for k, i in enumerate(env_indices(out)):
            run.echo(out[k], i, 3.0, 1, "a step of the envs on other workers after an abort")


async def _step_timeout_restarts(run: Run) -> None:
    run.needs("abort", "respawn")
    pool = await _timed_out_pool(run, "restart")
    await run.bounded(pool.reset(), "reset while env 1's worker is replaced (on_error='restart')")
    dead = [i for i in range(N) if not pool.executor.worker_alive(i)]
    run.expect(not dead, f"after the restart, worker_alive is False for envs {dead}")
    restarts = pool.stats().restarts
    run.expect(restarts[1] == 1, f"restarts per env are {restarts}: env 1 was not restarted once")
    out = await run.bounded(pool.step(echo_actions([2.0] * N, range(N))), "a step after the restart")
    for k, i in enumerate(env_indices(out)):
        run.echo(out[k], i, 2.0, 1, "a step after replacing a stuck worker")
    run.settled(pool, "after replacing a stuck worker")


async def _worker_death(run: Run) -> None:
    pool = await run.pool(probe_env_fns(faults={1: ProbeFault("sigkill")}))
    await run.bounded(pool.reset(), "reset")
    await run.bounded(pool.async_step_send(echo_actions([1.0] * N, range(N))), "send")
    what = "a step where env 1 kills its worker (SIGKILL)"
    results, errors = await run.answers(pool, range(N), what)
    run.expect(1 in errors, f"{what}: env 1 returned a result")
    error = errors[1]
    if not isinstance(error, EnvCrashedError):
        if error.exc_type.endswith(InCallersProcess.__name__):
            raise Skipped("its envs run in the caller's process: no worker can die alone")
        run.fail(f"{what}: env 1 raised {type(error).__name__}, not EnvCrashedError: {error}")
    for i, other in errors.items():  # envs sharing env 1's worker share its fate
        run.expect(
            isinstance(other, EnvCrashedError), f"{what}: env {i} raised {type(other).__name__}: {other}"
        )
    for i, row in results.items():
        run.echo(row, i, 1.0, 1, what)
    await run.raises(EnvCrashedError, pool.reset(env_index=[1]), "reset env 1 after its worker died")


CHECKS: dict[str, Callable[[Run], Awaitable[None]]] = {
    "start_and_close": _start_and_close,
    "kill_is_idempotent": _kill_is_idempotent,
    "env_code_runs_off_the_loop": _off_the_loop,
    "routing_plain_envs": _routing_plain,
    "routing_async_envs": _routing_async,
    "send_returns_before_step_finishes": _send_returns_early,
    "receive_min_get_max_get_env_index": _receive_rules,
    "cancelled_receives_lose_nothing": _cancelled_receives,
    "env_error_names_the_env": _env_error,
    "call_get_attr_set_attr": _calls,
    "busy_env_refuses_a_second_send": _busy_env,
    "close_with_commands_in_flight": _close_in_flight,
    "restart_after_env_error": _restart_after_error,
    "step_timeout_aborts_a_hung_step": _step_timeout_aborts,
    "step_timeout_restarts_the_worker": _step_timeout_restarts,
    "worker_death_is_a_crash": _worker_death,
}

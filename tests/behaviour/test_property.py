"""Property: under any mix of sends, receives, timeouts and cancellations, every send
yields exactly one result or one EnvError for its env, none lost, none duplicated."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings, strategies as st

from aenvs import AsyncEnvPool, EnvError
from aenvs.testing import echo_env_fns
from tests.helpers import actions

NUM_ENVS = 4

ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sets(st.integers(0, NUM_ENVS - 1), min_size=1), st.booleans()),
        st.tuples(st.just("recv"), st.integers(0, NUM_ENVS), st.none()),
        st.tuples(st.just("recv_timeout"), st.integers(1, NUM_ENVS), st.floats(0, 0.004)),
        st.tuples(st.just("cancel"), st.integers(1, NUM_ENVS), st.integers(0, 3)),
    ),
    max_size=30,
)


class Ledger:
    """What was sent and not yet answered, per env: the echoed action id (negative: must fail)."""

    def __init__(self) -> None:
        self.outstanding: dict[int, float] = {}
        self.next_id = 1.0

    def answer(self, out) -> None:
        if out.batch_size[0] == 0:  # min_get=0 found nothing ready
            return
        for (env, action, _), i in zip(
            out["next", "observation"].tolist(), out["env_index"].tolist(), strict=True
        ):
            assert int(env) == i
            assert i in self.outstanding, f"env {i}: a result nobody is waiting for (duplicate?)"
            assert action == self.outstanding.pop(i), f"env {i}: someone else's result"

    def fail(self, err: EnvError) -> None:
        assert self.outstanding.pop(err.env_index) < 0, f"env {err.env_index}: an error for a good action"


async def _scenario(executor: str, script: list[tuple]) -> None:
    ledger = Ledger()
    async with AsyncEnvPool(
        echo_env_fns(NUM_ENVS, asynchronous=True, delay=(0.0, 0.003)), executor=executor
    ) as pool:
        await pool.reset()

        async def receive(coro) -> None:
            try:
                ledger.answer(await coro)
            except EnvError as err:
                ledger.fail(err)

        for op, arg, extra in script:
            if op == "send":
                idle = sorted(i for i in arg if i not in ledger.outstanding)
                if not idle:
                    continue
                ids = []
                for i in idle:
                    ledger.outstanding[i] = -ledger.next_id if extra and i == idle[0] else ledger.next_id
                    ids.append(ledger.outstanding[i])
                    ledger.next_id += 1
                await pool.async_step_send(actions(ids, env_index=idle))
            elif op == "recv":
                await receive(pool.async_step_recv(min_get=min(arg, len(ledger.outstanding))))
            elif op == "recv_timeout" and ledger.outstanding:
                try:
                    await receive(
                        pool.async_step_recv(min_get=min(arg, len(ledger.outstanding)), timeout=extra)
                    )
                except TimeoutError:
                    pass
            elif op == "cancel" and ledger.outstanding:
                task = asyncio.create_task(pool.async_step_recv(min_get=min(arg, len(ledger.outstanding))))
                for _ in range(extra):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await receive(task)
                except asyncio.CancelledError:
                    pass
        while ledger.outstanding:
            await receive(pool.async_step_recv(min_get=1, timeout=10))
        stats = pool.stats()
        assert stats.in_flight == 0 and stats.ready == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
def test_every_send_yields_exactly_one_result_or_error(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop], script: list[tuple]
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_scenario(executor, script))

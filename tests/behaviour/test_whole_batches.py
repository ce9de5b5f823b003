"""Lockstep receives of a whole batch: every env answered at once, without a completion per
env, with the same results as a receive env by env, on every executor and loop; and the
runner's column writes of a whole batch equal its writes env by env, whatever an env does
in the middle of the batch."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs import AsyncEnvPool
from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, unpack
from aenvs._runner import EnvRunner
from tests.conftest import PoolFactory

N = 4


class ScriptedEnv(gym.Env[np.ndarray, np.int64]):
    """Observation ``[env, step, action]``; episodes of ``episode`` steps (every third one
    truncated rather than terminated); ``script`` says what step ``t`` of the env does
    beyond that: ``"info"`` (an info dict), ``"list"`` (the observation as a list: not the
    array the space says), ``"raise"``."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, env_index: int, script: Mapping[int, str] | None = None, episode: int = 5) -> None:
        self.env_index, self.script, self.episode = env_index, dict(script or {}), episode
        self.steps = self.episodes = self.total = 0

    def _obs(self, action: float) -> np.ndarray:
        return np.array([self.env_index, self.steps, action], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.steps = 0
        self.episodes += 1
        return self._obs(-1.0), {}

    def step(self, action: np.int64) -> Any:
        self.steps += 1
        self.total += 1
        what = self.script.get(self.total)
        if what == "raise":
            raise RuntimeError(f"scripted failure of env {self.env_index} at step {self.total}")
        ended = self.steps >= self.episode
        truncated = ended and self.episodes % 3 == 0
        obs: Any = self._obs(float(action))
        if what == "list":
            obs = obs.tolist()
        info = {"step": self.total} if what == "info" else {}
        return obs, float(action) + 0.5, ended and not truncated, truncated, info


def runners(script: Mapping[int, Mapping[int, str]]) -> tuple[EnvRunner, EnvRunner, Buffers, Buffers]:
    """Two runners of the same scripted envs, one writing whole batches by column, the other
    env by env, each with its own buffers."""
    warm_up(functools.partial(ScriptedEnv, 0, None))
    made: list[tuple[EnvRunner, Buffers]] = []
    for _ in range(2):
        fns = {i: functools.partial(ScriptedEnv, i, script.get(i)) for i in range(N)}
        runner = EnvRunner.build(fns, num_envs=N)
        buffers = Buffers.allocate([runner.specs[i] for i in range(N)])
        runner.attach({i: buffers.rows(i) for i in range(N)})
        made.append((runner, buffers))
    (by_column, columns), (by_env, rows) = made
    assert by_column._run is not None  # pyright: ignore[reportPrivateUsage]
    by_env._run = None  # pyright: ignore[reportPrivateUsage]
    return by_column, by_env, columns, rows


def warm_up(fn: Any) -> None:
    """Reset and step an env of ``fn``'s kind once: the first ones of a kind run one at a time
    (their library may still import modules), on the general path, not by column."""
    runner = EnvRunner.build({0: fn}, num_envs=1)
    try:
        runner.attach({0: Buffers.allocate([runner.specs[0]]).rows(0)})
        runner.run_plain(Command(CommandKind.RESET, [0]))
        runner.run_plain(Command(CommandKind.STEP, [0]))
    finally:
        runner.close()


def answers(result: list[Completion] | Any) -> list[tuple[Any, ...]]:
    return [
        (c.env_index, c.done, c.was_reset, c.error and c.error.exc_type, c.extras, c.reset_extras)
        for c in unpack(result)
    ]


def assert_same_buffers(a: Buffers, b: Buffers) -> None:
    for group_a, group_b in zip(a.groups, b.groups, strict=True):
        for which in ("reset", "step", "action"):
            for key, array in getattr(group_a, which).items():
                np.testing.assert_array_equal(array, getattr(group_b, which)[key], err_msg=f"{which} {key}")


@pytest.mark.parametrize(
    "script",
    [
        {},
        {1: {3: "info"}},
        {2: {4: "list"}},
        {0: {2: "raise"}, 3: {6: "raise"}},
        {1: {2: "list", 5: "info"}, 2: {5: "raise", 7: "info"}},
    ],
    ids=["plain", "info", "not-an-array", "raises", "mixed"],
)
def test_a_runner_writes_a_whole_batch_by_column_as_it_does_env_by_env(
    script: Mapping[int, Mapping[int, str]],
) -> None:
    by_column, by_env, columns, rows = runners(script)
    everyone = list(range(N))
    rng = np.random.default_rng(0)
    try:
        reset = Command(CommandKind.RESET, everyone)
        assert answers(by_column.run_plain(reset)) == answers(by_env.run_plain(reset))
        for t in range(12):
            kind = CommandKind.STEP_AND_RESET if t % 3 else CommandKind.STEP
            chosen = rng.integers(0, 3, N)
            for buffers in (columns, rows):
                buffers.groups[0].action[("action",)][:] = chosen
            got = by_column.run_plain(Command(kind, everyone), packed=True)
            expected = by_env.run_plain(Command(kind, everyone), packed=True)
            assert answers(got) == answers(expected), f"command {t}"
            assert type(got) is type(expected)
            assert_same_buffers(columns, rows)
            if kind is CommandKind.STEP:  # what a step-and-reset would have done, for the next
                ended = [c.env_index for c in unpack(got) if c.done or c.error is not None]
                if ended:
                    again = Command(CommandKind.RESET, ended)
                    assert answers(by_column.run_plain(again)) == answers(by_env.run_plain(again))
    finally:
        by_column.close()
        by_env.close()


def test_a_plain_whole_batch_comes_packed_and_an_env_with_more_to_say_unpacks_it() -> None:
    by_column, by_env, _, _ = runners({1: {1: "info"}})
    everyone = list(range(N))
    try:
        for runner in (by_column, by_env):
            runner.run_plain(Command(CommandKind.RESET, everyone))
            first = runner.run_plain(Command(CommandKind.STEP, everyone), packed=True)
            assert isinstance(first, list) and first[1].extras == {("info",): {"step": 1}}
            second = runner.run_plain(Command(CommandKind.STEP, everyone), packed=True)
            assert second == (CommandKind.STEP, everyone, bytes(N), bytes(N))
    finally:
        by_column.close()
        by_env.close()


def scripted_env_fns(script: Mapping[int, Mapping[int, str]]) -> list[Any]:
    return [functools.partial(ScriptedEnv, i, script.get(i)) for i in range(N)]


def count_whole_batches(pool: AsyncEnvPool) -> list[CommandKind]:
    """The kinds of the batches the pool's executor answered whole, as they come: handed
    to a receive (``run_whole``) or run where a whole-batch call sent them (``run_now``)."""
    executor: Any = pool.executor
    run_whole, run_now, taken = executor.run_whole, executor.run_now, list[CommandKind]()
    inside_run_whole = False  # the inline executor's run_whole runs its command by run_now

    def counted(kind: CommandKind, num_envs: int) -> Any:
        nonlocal inside_run_whole
        inside_run_whole = True
        try:
            answers = run_whole(kind, num_envs)
        finally:
            inside_run_whole = False
        if answers is not None:
            taken.append(kind)
        return answers

    def counted_now(command: Command) -> Any:
        answers = run_now(command)
        if answers is not None and not inside_run_whole:
            taken.append(command.kind)
        return answers

    executor.run_whole, executor.run_now = counted, counted_now
    return taken


def by_env(td: TensorDictBase) -> TensorDictBase:
    return td[torch.argsort(td["env_index"])]


def assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        left, right = a.get(key), b.get(key)
        if isinstance(left, torch.Tensor):
            assert torch.equal(left, right), key
        else:
            assert left.tolist() == right.tolist(), key


async def test_a_lockstep_batch_gives_what_a_receive_env_by_env_gives(
    make_pool: PoolFactory, executor: str
) -> None:
    """The same envs stepped in lockstep (whole batches) and received env by env (named in
    reverse, then sorted): the same results, resets, info entries and stats."""
    script = {1: {3: "info", 9: "info"}}
    whole = await make_pool(scripted_env_fns(script))
    named = await make_pool(scripted_env_fns(script))
    taken = count_whole_batches(whole)
    reverse = list(reversed(range(N)))
    td_whole, td_named = await whole.reset(), await named.reset()
    steps = 12
    for t in range(steps):
        action = torch.tensor([(t + i) % 3 for i in range(N)])
        td_whole["action"], td_named["action"] = action, action.clone()
        out_whole, td_whole = await whole.step_and_maybe_reset(td_whole)
        await named.async_step_and_maybe_reset_send(td_named)
        out_named, td_named = await named.async_step_and_maybe_reset_recv(env_index=reverse)
        out_named, td_named = by_env(out_named), by_env(td_named)
        assert_same(out_whole, out_named)
        assert_same(td_whole, td_named)
    td_whole, td_named = await whole.reset(), await named.reset()
    for t in range(4):  # plain steps, within an episode; and the same as columns
        action = torch.tensor([(t * i) % 3 for i in range(N)])
        await whole.async_step_send(td_whole.set("action", action))
        await named.async_step_send(td_named.set("action", action.clone()))
        if t % 2:
            assert_same(
                await whole.async_step_recv(min_get=N), by_env(await named.async_step_recv(env_index=reverse))
            )
            continue
        got = await whole.async_step_recv_columns(min_get=N)
        expected = await named.async_step_recv_columns(min_get=None, env_index=reverse)
        order = np.argsort(expected[("env_index",)])
        assert got.keys() == expected.keys()
        for key, column in got.items():
            other = expected[key]
            other = [other[k] for k in order] if isinstance(other, list) else other[order]
            np.testing.assert_array_equal(np.asarray(column), np.asarray(other), err_msg=str(key))
    stats_whole, stats_named = whole.stats(), named.stats()
    assert stats_whole.steps == stats_named.steps
    assert (stats_whole.in_flight, stats_whole.ready) == (0, 0)
    assert whole.env_states == named.env_states
    if executor in ("inline", "process"):  # every batch went whole but the two with an info entry
        assert taken == [CommandKind.STEP_AND_RESET] * (steps - 2) + [CommandKind.STEP] * 4
    else:
        assert taken == []

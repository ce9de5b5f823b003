"""The drop-in's fast paths give TorchRL's results: plain ``GymEnv`` members stepped through
their gymnasium env, a ``step_and_maybe_reset`` that resets ended episodes in the step's
own pool call, and TorchRL's step machinery skipped where it would add nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N = 3


class _Gym:
    """A factory of ``GymEnv(name, **kwargs)`` (a top-level class: pickled by reference)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name, self.kwargs = name, kwargs
        self.__name__ = name + "".join(f"-{k}={v}" for k, v in kwargs.items())

    def __call__(self) -> Any:
        return import_torchrl("torchrl.envs").GymEnv(self.name, **self.kwargs)


def _ours(name: str) -> Any:
    return getattr(import_torchrl("aenvs.torchrl"), name)


def _theirs(name: str) -> Any:
    return getattr(import_torchrl("torchrl.envs"), name)


def _no_reset(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a separate reset: the step should have reset the ended episodes")


def _not_by_columns(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a step through TensorDicts: the pool's columns should have carried it")


def _step_loop(env: Any, steps: int, fused: bool = False) -> list[tuple[Any, Any]]:
    """``step_and_maybe_reset`` with seeded random actions: every step's two TensorDicts
    (the step's as returned, not copied: later steps must not write into it).
    ``fused``: fail on any pool reset after the first (the steps reset ended episodes), and
    on any step not made through the pool's columns."""
    env.set_seed(3)
    torch.manual_seed(1)
    td = env.reset()
    if fused:
        env.pool.reset = _no_reset
        env.pool.step_and_maybe_reset = env.pool.step = _not_by_columns
    out: list[tuple[Any, Any]] = []
    for _ in range(steps):
        stepped, td = env.step_and_maybe_reset(env.rand_action(td))
        out.append((stepped, td.clone()))
    return out


def _assert_same(got: Any, expected: Any, where: str) -> None:
    assert got.device == expected.device and got.batch_size == expected.batch_size, where
    assert set(got.keys(True, True)) == set(expected.keys(True, True)), where
    for key in expected.keys(True, True):
        assert got[key].dtype == expected[key].dtype, (where, key)
        assert torch.equal(got[key], expected[key]), (where, key)


def _assert_same_loops(got: list[tuple[Any, Any]], expected: list[tuple[Any, Any]]) -> None:
    """Two :func:`_step_loop` runs step by step the same."""
    for t, ((got_step, got_next), (step, nxt)) in enumerate(zip(got, expected, strict=True)):
        _assert_same(got_step, step, f"step {t}")
        _assert_same(got_next, nxt, f"next input {t}")


# CartPole: a few envs end at once (the others' rows kept, the action zeroed where reset, as
# TorchRL does); Pendulum: every env truncated at step 200 at once (the reset taken whole)
@pytest.mark.parametrize("make", [_Gym("CartPole-v1"), _Gym("Pendulum-v1")], ids=lambda f: f.__name__)
def test_step_loop_same_as_torchrl(executor: str, make: _Gym) -> None:
    theirs = _theirs("SerialEnv")(N, make)
    expected = _step_loop(theirs, 205)
    theirs.close()
    ours = _ours("SerialEnv")(N, make, executor=executor)
    try:
        got = _step_loop(ours, 205, fused=True)
    finally:
        ours.close()
    assert sum(int(s["next", "done"].sum()) for s, _ in expected) > 0
    _assert_same_loops(got, expected)


def test_transformed_env_same_as_torchrl(executor: str) -> None:
    envs = import_torchrl("torchrl.envs")
    make = _Gym("CartPole-v1")

    def rollout(base: Any) -> Any:
        env = envs.TransformedEnv(base, envs.StepCounter(max_steps=7))
        env.set_seed(0)
        torch.manual_seed(0)
        try:
            return env.rollout(40, break_when_any_done=False)
        finally:
            env.close()

    expected = rollout(_theirs("SerialEnv")(N, make))
    got = rollout(_ours("ParallelEnv")(N, make, executor=executor))
    assert int(expected["next", "truncated"].sum()) > 0  # the step counter ended episodes
    _assert_same(got, expected, "rollout")


@pytest.mark.parametrize(
    "make", [_Gym("CartPole-v1", frame_skip=2), _Gym("Pendulum-v1", categorical_action_encoding=True)]
)
def test_other_gym_members_same_as_torchrl(executor: str, make: _Gym) -> None:
    """A frame skip of TorchRL's own keeps the TorchRL member; both give TorchRL's results."""
    theirs = _theirs("SerialEnv")(N, make)
    expected = _step_loop(theirs, 30)
    theirs.close()
    ours = _ours("SerialEnv")(N, make, executor=executor)
    try:
        got = _step_loop(ours, 30)
    finally:
        ours.close()
    _assert_same_loops(got, expected)


def test_plain_gym_env_detection() -> None:
    from aenvs._adapters.torchrl_gym import plain_gym_env

    envs = import_torchrl("torchrl.envs")

    class OwnGymEnv(envs.GymEnv):  # a subclass may change any step
        pass

    plain = [envs.GymEnv("CartPole-v1"), envs.GymEnv("Pendulum-v1", categorical_action_encoding=True)]
    not_plain = [
        envs.GymEnv("CartPole-v1", frame_skip=2),
        envs.TransformedEnv(envs.GymEnv("CartPole-v1"), envs.StepCounter()),
        OwnGymEnv("CartPole-v1"),
        envs.GymEnv("FrozenLake-v1"),  # a Discrete observation: one-hot in TorchRL, an index here
    ]
    try:
        assert all(plain_gym_env(env) is env._env for env in plain)
        assert [plain_gym_env(env) for env in not_plain] == [None] * len(not_plain)
    finally:
        for env in plain + not_plain:
            env.close(raise_if_closed=False)


def test_member_attributes_are_the_torchrl_envs(executor: str) -> None:
    env = _ours("SerialEnv")(2, _Gym("CartPole-v1"), executor=executor)
    try:
        env.reset()  # TorchRL's batched envs forward attributes once started
        assert env.wrapper_frame_skip == [1, 1]  # a GymEnv attribute, not the gymnasium env's
    finally:
        env.close()


def test_bool_one_hot_actions(executor: str) -> None:
    """One-hot actions in any dtype (bool too) are taken as TorchRL takes them."""
    env = _ours("SerialEnv")(2, _Gym("CartPole-v1"), executor=executor)
    try:
        results = []
        for dtype in (torch.bool, torch.int64, torch.float32):
            env.set_seed(0)
            td = env.reset()
            td["action"] = torch.tensor([[0, 1], [1, 0]], dtype=dtype)
            results.append(env.step(td)["next", "observation"])
    finally:
        env.close()
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def _gym_cartpole() -> Any:
    import gymnasium

    return gymnasium.make("CartPole-v1")


def test_gymnasium_members_through_columns_same_as_through_tensordicts(executor: str) -> None:
    """gymnasium members (the drop-in's own specs of their spaces): the step through the
    pool's columns gives what the step through its TensorDicts gives."""
    by_tensordicts = _ours("SerialEnv")(N, _gym_cartpole, executor=executor)
    by_tensordicts._column_layouts = lambda plan: None  # the TensorDict path, as before the columns
    try:
        expected = _step_loop(by_tensordicts, 60)
    finally:
        by_tensordicts.close()
    by_columns = _ours("SerialEnv")(N, _gym_cartpole, executor=executor)
    try:
        got = _step_loop(by_columns, 60, fused=True)
    finally:
        by_columns.close()
    assert sum(int(s["next", "done"].sum()) for s, _ in expected) > 0
    _assert_same_loops(got, expected)

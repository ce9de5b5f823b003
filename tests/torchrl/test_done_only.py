"""A TorchRL env in a pool whose episodes end with ``"done"`` alone, on every executor: the
pool sees the end (TorchRL's rule: done, terminated or truncated ends an episode, and a
done that neither flag explains is a termination), resets the env, and stops rollouts."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvState
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N, ENDS_AT = 2, 3


@functools.cache
def _counter_class() -> Any:
    """``Counter``, a TorchRL env (built on first use: importing this module needs no torchrl)."""
    data = import_torchrl("torchrl.data")

    def flag() -> Any:
        return data.Categorical(2, shape=(1,), dtype=torch.bool)

    class Counter(import_torchrl("torchrl.envs").EnvBase):
        """Observes how many steps it took since its reset; ends at ``ends_at`` steps if given
        (setting only ``"done"``), else never."""

        def __init__(self, ends_at: int | None = None, done_only: bool = False) -> None:
            super().__init__()
            self.ends_at = ends_at
            self.observation_spec = data.Composite(observation=data.Unbounded(shape=(1,)))
            self.action_spec = data.Categorical(2, shape=())
            self.reward_spec = data.Unbounded(shape=(1,))
            if done_only:
                self.full_done_spec = data.Composite(done=flag())
            else:
                self.full_done_spec = data.Composite(done=flag(), terminated=flag(), truncated=flag())
            self.count = 0

        def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
            self.count = 0
            return TensorDict(observation=torch.zeros(1))

        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            self.count += 1
            done = self.ends_at is not None and self.count >= self.ends_at
            return TensorDict(
                observation=torch.full((1,), float(self.count)),
                reward=torch.ones(1),
                done=torch.tensor([done]),
            )

        def _set_seed(self, seed: int | None) -> None:
            pass

    return Counter


def truncated_into_done() -> Any:
    """An env that never ends by itself, cut by TorchRL's StepCounter writing into "done" only."""
    envs = import_torchrl("torchrl.envs")
    return envs.TransformedEnv(_counter_class()(), envs.StepCounter(max_steps=ENDS_AT, truncated_key="done"))


def done_only_spec() -> Any:
    """An env whose done spec has only "done"."""
    return _counter_class()(ends_at=ENDS_AT, done_only=True)


FACTORIES = pytest.mark.parametrize("factory", [truncated_into_done, done_only_spec])


def test_the_torchrl_envs_end_with_done_alone() -> None:
    """What the pool must follow: TorchRL sets "done" (terminated mirrors it where the env
    has no "terminated"), and TorchRL's own rollout stops there."""
    for factory in (truncated_into_done, done_only_spec):
        env = factory()
        rollout = env.rollout(10, break_when_any_done=True)
        assert rollout.batch_size == torch.Size([ENDS_AT])
        assert rollout["next", "done"][:, 0].tolist() == [False, False, True]


def _actions(td: TensorDictBase) -> TensorDictBase:
    td["action"] = torch.zeros(N, dtype=torch.int64)
    return td


@FACTORIES
async def test_step_and_maybe_reset_resets_it_when_done(make_pool, factory) -> None:
    pool = await make_pool([factory] * N)
    td = await pool.reset()
    counts, dones = [], []
    for _ in range(2 * ENDS_AT):
        out, td = await pool.step_and_maybe_reset(_actions(td))
        counts.append(out["next", "observation"][:, 0].tolist())
        dones.append(out["next", "done"][:, 0].tolist())
        # where the episode ended, the next input is the reset's observation
        expected = torch.where(out["next", "done"][:, 0], 0.0, out["next", "observation"][:, 0])
        assert td["observation"][:, 0].tolist() == expected.tolist()
    assert counts == [[1.0] * N, [2.0] * N, [3.0] * N] * 2  # reset after each third step
    assert dones == [[False] * N, [False] * N, [True] * N] * 2
    assert out["next", "terminated"][:, 0].tolist() == [True] * N  # done alone is a termination
    assert out["next", "truncated"][:, 0].tolist() == [False] * N


@FACTORIES
async def test_rollout_breaks_when_it_is_done(make_pool, factory) -> None:
    pool = await make_pool([factory] * N)
    rollout = await pool.rollout(10, break_when_any_done=True)
    assert rollout.batch_size == torch.Size([N, ENDS_AT])
    assert rollout["next", "done"][0, :, 0].tolist() == [False, False, True]


@FACTORIES
async def test_its_state_goes_done(make_pool, factory) -> None:
    pool = await make_pool([factory] * N)
    td = await pool.reset()
    for _ in range(ENDS_AT - 1):
        td = (await pool.step(_actions(td)))["next"]
    assert pool.env_states == [EnvState.RUN] * N
    await pool.step(_actions(td))
    assert pool.env_states == [EnvState.DONE] * N

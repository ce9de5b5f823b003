"""Multi-agent envs (PettingZoo parallel envs, RLlib-style dict envs) as pool members, in
TorchRL's multi-agent layout: groups, masks as agents come and go, actions passed to the
present agents only, the whole env's done and reset, lazy stacking of differing agent
counts, and errors named by env and key."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import pettingzoo
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenvs import EnvError, MultiAgent, SerialEnv
from tests.behaviour.multi_agent_envs import Convoy, Pair, Stray, TurnBased, Walkers
from tests.conftest import PoolFactory


def flat(value: torch.Tensor) -> list[object]:
    return value.flatten().tolist()


def act(td: TensorDictBase, walker: torch.Tensor, guard: torch.Tensor | None = None) -> TensorDictBase:
    """Set the walkers' (and the guard's) actions of a whole batch."""
    td["walker", "action"] = walker
    td["guard", "action"] = guard if guard is not None else torch.zeros(td.batch_size[0], 1, 2)
    return td


async def test_groups_hold_observation_mask_reward_and_flags_with_the_agent_dim(
    make_pool: PoolFactory,
) -> None:
    pool = await make_pool([Walkers, Walkers])
    td = await pool.reset()
    assert td["walker", "observation"].shape == (2, 3, 2)
    assert td["walker", "observation"][0, :, 0].tolist() == [0.0, 1.0, 2.0]  # each walker's own row
    assert td["guard", "observation"].shape == (2, 1, 3)
    assert td["walker", "mask"].dtype == torch.bool and td["walker", "mask"].all()
    for group, n in (("walker", 3), ("guard", 1)):
        for flag in ("done", "terminated", "truncated"):
            assert td[group, flag].shape == (2, n, 1) and not td[group, flag].any()
        assert td[group, "reward"].shape == (2, n, 1)
    assert td["done"].shape == (2, 1)
    spec = pool.env_specs[0]
    assert [leaf.key for leaf in spec.action_leaves] == [("guard", "action"), ("walker", "action")]
    assert [leaf.shape for leaf in spec.action_leaves] == [(1, 2), (3,)]
    out = await pool.step(act(td, torch.tensor([[0, 1, 2], [2, 2, 2]]), torch.full((2, 1, 2), 0.25)))
    assert out["next", "walker", "reward"][:, :, 0].tolist() == [[0.0, 1.0, 2.0], [2.0, 2.0, 2.0]]
    assert flat(out["next", "guard", "reward"]) == [0.5, 0.5]
    assert flat(out["next", "reward"]) == [3.5, 6.5]  # the root reward: the sum over the agents
    assert out["next", "walker", "observation"][0, :, 1].tolist() == [1.0, 1.0, 1.0]


async def test_masks_follow_agents_leaving_and_only_present_agents_get_actions(
    make_pool: PoolFactory,
) -> None:
    pool = await make_pool([Walkers])
    td = await pool.reset()
    masks, dones = [], []
    for _ in range(3):
        # the masked agents' rows hold garbage (2): it must never reach the env
        walker = torch.where(td["walker", "mask"], torch.tensor([0, 1, 1]), torch.tensor(2))
        out = await pool.step(act(td, walker))
        nxt = out["next"]
        masks.append(nxt["walker", "mask"][0].tolist())
        dones.append(flat(nxt["walker", "done"][0]))
        if len(masks) == 1:
            assert nxt["walker", "observation"][0, 0].tolist() == [0.0, 1.0]  # not yet gone
        if len(masks) == 2:  # walker_0 left at step 2: its last observation, then zeros
            assert nxt["walker", "observation"][0, 0].tolist() == [0.0, 2.0]
            assert flat(nxt["walker", "terminated"][0]) == [True, False, False]
        if len(masks) == 3:
            assert nxt["walker", "observation"][0, 0].tolist() == [0.0, 0.0]
            assert nxt["walker", "reward"][0, 0].item() == 0.0
        td = nxt
    assert masks == [[True, True, True], [False, True, True], [False, False, True]]
    assert dones == [[False, False, False], [True, False, False], [True, True, False]]
    (received,) = await pool.get_attr("received")
    assert [sorted(step) for step in received] == [
        ["guard_0", "walker_0", "walker_1", "walker_2"],
        ["guard_0", "walker_0", "walker_1", "walker_2"],
        ["guard_0", "walker_1", "walker_2"],
    ]
    assert all(step[a] in (0, 1) for step in received for a in step if a.startswith("walker"))


async def test_the_whole_env_ends_when_no_agent_is_left_and_resets_as_a_whole(make_pool: PoolFactory) -> None:
    pool = await make_pool([functools.partial(Walkers, 2), functools.partial(Walkers, 2, max_steps=2)])
    td = await pool.reset()
    out, td = await pool.step_and_maybe_reset(act(td, torch.ones(2, 2, dtype=torch.long)))
    assert flat(out["next", "done"]) == [False, False]
    out, td = await pool.step_and_maybe_reset(act(td, torch.ones(2, 2, dtype=torch.long)))
    # env 1 hit max_steps: its agents still there are truncated, and so is the env
    assert flat(out["next", "done"]) == [False, True]
    assert flat(out["next", "truncated"]) == [False, True]
    assert flat(out["next", "walker", "truncated"][1]) == [False, True]
    assert flat(out["next", "guard", "truncated"][1]) == [True]
    assert td["walker", "mask"].tolist() == [[False, True], [True, True]]  # env 1 was reset
    assert not td["walker", "done"][1].any()
    out, td = await pool.step_and_maybe_reset(act(td, torch.ones(2, 2, dtype=torch.long)))
    # env 0: the last walker left, then the guard: every agent terminated, and the env
    assert flat(out["next", "terminated"]) == [True, False]
    assert out["next", "walker", "terminated"][0].all() and out["next", "guard", "terminated"][0].all()
    assert not out["next", "walker", "mask"][0].any()
    assert td["walker", "mask"][0].all() and td["walker", "observation"][0, :, 1].tolist() == [0.0, 0.0]


async def test_an_rllib_style_dict_env_with_agents_joining_and_leaving(make_pool: PoolFactory) -> None:
    pool = await make_pool([Convoy, Convoy])
    td = await pool.reset()
    assert td["car", "mask"].all() and not td["light", "mask"].any()  # the light joins later
    assert td["light", "observation"].dtype == torch.int64  # Discrete(4), stacked per agent
    light_masks, car_masks, rewards = [], [], []
    for _ in range(5):
        td["car", "action"] = torch.tensor([[1, 0], [1, 1]])
        td["light", "action"] = torch.full((2, 1), 2)
        out = await pool.step(td)
        td = out["next"]
        light_masks.append(td["light", "mask"][0, 0].item())
        car_masks.append(td["car", "mask"][0].tolist())
        rewards.append(td["reward"][:, 0].tolist())
    assert light_masks == [False, True, True, True, False]
    assert car_masks == [[True, True], [True, True], [True, False], [True, False], [False, False]]
    assert rewards[2] == [21.0, 22.0]  # the light's first action (10 * 2) and the cars'
    assert flat(td["terminated"]) == [True, True]  # "__all__" ended the episode
    assert td["car", "terminated"].all() and td["light", "terminated"].all()
    assert td["info", "light", "colour"][0] == "red"
    received, _ = await pool.get_attr("received")
    assert received[2] == {"car_0": 1, "car_1": 0, "light": 2}  # the light acts from step 3
    assert received[3] == {"car_0": 1, "light": 2}  # car_1 is gone


async def test_grouping_by_name_prefix_by_hand_and_int_agent_ids(make_pool: PoolFactory) -> None:
    regroup = functools.partial(
        MultiAgent, groups={"first": ["walker_2", "walker_0"], "rest": ["walker_1"], "guards": ["guard_0"]}
    )
    pool = await make_pool(
        [lambda: regroup(Walkers()), Pair, lambda: MultiAgent(Pair(), groups={"pair": [1, 0]})],
    )
    td = await pool.reset()
    first, pair_default, pair = td.tensordicts if isinstance(td, LazyStackedTensorDict) else []
    assert first["first", "observation"][:, 0].tolist() == [2.0, 0.0]  # in the order given
    assert first["rest", "observation"].shape == (1, 2)
    assert set(pair_default.keys()) >= {"0", "1"}  # ids that do not read "<prefix>_<n>": one group each
    assert pair["pair", "observation"][:, 1].tolist() == [1.0, 0.0]
    first["first", "action"] = torch.tensor([2, 0])
    first["rest", "action"] = torch.tensor([1])
    first["guards", "action"] = torch.zeros(1, 2)
    pair_default["0", "action"] = torch.tensor([[0.5]])
    pair_default["1", "action"] = torch.tensor([[1.5]])
    pair["pair", "action"] = torch.tensor([[7.0], [3.0]])
    out = await pool.step(td)
    walkers, pair_default_received, pair_received = await pool.get_attr("received")
    assert walkers[0] == {"walker_2": 2, "walker_0": 0, "walker_1": 1, "guard_0": [0.0, 0.0]}
    assert pair_default_received == [{0: [0.5], 1: [1.5]}]
    assert pair_received == [{1: [7.0], 0: [3.0]}]
    assert out["next", "reward"][:, 0].tolist() == [3.0, 2.0, 10.0]


async def test_differing_agent_counts_stack_lazily(make_pool: PoolFactory) -> None:
    pool = await make_pool([functools.partial(Walkers, 2), functools.partial(Walkers, 3)])
    assert not pool.is_dense
    td = await pool.reset()
    assert isinstance(td, LazyStackedTensorDict)
    two, three = td.tensordicts
    assert two["walker", "observation"].shape == (2, 2) and three["walker", "observation"].shape == (3, 2)
    assert two["guard", "observation"].shape == (1, 3)
    for sub in td.tensordicts:
        n = sub["walker", "mask"].shape[0]
        sub["walker", "action"] = torch.arange(n) % 3
        sub["guard", "action"] = torch.zeros(1, 2)
    out = await pool.step(td)
    assert [sub["reward"].item() for sub in out["next"].tensordicts] == [1.0, 3.0]
    (two_received, three_received) = await pool.get_attr("received")
    assert two_received[0] == {"walker_0": 0, "walker_1": 1, "guard_0": [0.0, 0.0]}
    assert three_received[0]["walker_2"] == 2


async def test_a_real_pettingzoo_env(make_pool: PoolFactory) -> None:
    pool = await make_pool(
        [functools.partial(pettingzoo.make, "parallel", "classic/rps-v2", max_cycles=3)] * 2
    )
    td = await pool.reset()
    assert td["player", "observation"].shape == (2, 2) and td["player", "mask"].all()
    rock, paper = 0, 1
    for step in range(3):
        td["player", "action"] = torch.tensor([[rock, paper], [paper, paper]])
        out = await pool.step(td)
        td = out["next"]
        assert td["player", "reward"][:, :, 0].tolist() == [[-1.0, 1.0], [0.0, 0.0]]
        assert td["player", "observation"][0].tolist() == [paper, rock]  # each sees the other's move
        assert flat(td["done"]) == [step == 2] * 2
    assert flat(td["truncated"]) == [True, True] and td["player", "truncated"].all()


def test_the_sync_shim_rolls_out_through_agents_leaving_and_episodes_ending(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        return act(td, torch.ones(td.batch_size[0], 2, dtype=torch.long))

    env = SerialEnv(2, functools.partial(Walkers, 2), executor=executor, loop_factory=loop_factory)
    try:
        traj = env.rollout(5, policy, break_when_any_done=False)
        assert traj.batch_size == (2, 5)
        # walker_0 leaves at step 2, walker_1 and the guard at step 3; then a new episode
        assert traj["walker", "mask"][0].tolist() == [
            [True, True],
            [True, True],
            [False, True],
            [True, True],
            [True, True],
        ]
        assert flat(traj["next", "done"][0]) == [False, False, True, False, False]
        assert flat(traj["next", "reward"][0]) == [2.0, 2.0, 1.0, 2.0, 2.0]
        assert env.rollout(5, policy).batch_size == (2, 2)  # stops at the first agent's done, as TorchRL
    finally:
        env.close()


# -- errors ------------------------------------------------------------------------------


async def test_actions_for_the_wrong_number_of_agents_are_refused_before_dispatch(
    make_pool: PoolFactory,
) -> None:
    pool = await make_pool([Walkers, Walkers])
    td = await pool.reset()
    with pytest.raises(ValueError, match=r"env 0 \(and 1 more\): 'walker\.action' has shape \(2,\)"):
        await pool.step(act(td, torch.ones(2, 2, dtype=torch.long)))
    del td["guard", "action"]
    td["walker", "action"] = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"the input has no 'guard\.action' entry"):
        await pool.step(td)
    with pytest.raises(ValueError, match=r"'walker\.action' has dtype torch\.float32"):
        await pool.step(act(td, torch.ones(2, 3)))
    out = await pool.step(act(td, torch.ones(2, 3, dtype=torch.long)))  # the pool is still usable
    (received, _) = await pool.get_attr("received")
    assert len(received) == 1 and flat(out["next", "reward"]) == [3.0, 3.0]


async def test_lazy_pools_name_the_env_whose_agent_count_does_not_fit(make_pool: PoolFactory) -> None:
    pool = await make_pool([functools.partial(Walkers, 2), functools.partial(Walkers, 3)])
    td = await pool.reset()
    for sub in td.tensordicts:
        sub["walker", "action"] = torch.zeros(2, dtype=torch.long)  # right for env 0 only
        sub["guard", "action"] = torch.zeros(1, 2)
    with pytest.raises(
        ValueError, match=r"env 1: 'walker\.action' has shape \(2,\) per env, expected \(3,\)"
    ):
        await pool.step(td)
    assert await pool.get_attr("received") == [[], []]


async def test_an_env_observing_an_agent_it_does_not_have_fails_naming_it(make_pool: PoolFactory) -> None:
    pool = await make_pool([Convoy, Stray])
    td = await pool.reset()
    td["car", "action"] = torch.zeros(2, 2, dtype=torch.long)
    td["light", "action"] = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(EnvError, match=r"observation for agent 'ghost', which is not one of its") as info:
        await pool.step(td)
    assert info.value.env_index == 1 and info.value.command == "step"


@pytest.mark.parametrize(
    ("groups", "words"),
    [
        (
            {"cars": ["car_0", "car_1", "bus"], "light": ["light"]},
            "names agent 'bus', which the env does not have",
        ),
        ({"cars": ["car_0"], "light": ["light"]}, r"agents \['car_1'\] are in no group"),
        ({"all": ["car_0", "car_1", "light"]}, "agent 'light' has other spaces than agent 'car_0'"),
        ({"cars": ["car_0", "car_1"], "next": ["light"]}, "'next' cannot name a group"),
    ],
)
async def test_bad_groups_fail_the_make_naming_the_agent(
    make_pool: PoolFactory, groups: dict[str, list[str]], words: str
) -> None:
    with pytest.raises(EnvError, match=words) as info:
        await make_pool([Convoy, lambda: MultiAgent(Convoy(), groups=groups)])
    assert info.value.env_index == 1 and info.value.command == "make"


async def test_turn_based_pettingzoo_envs_are_refused(make_pool: PoolFactory) -> None:
    with pytest.raises(EnvError, match="AEC") as info:
        await make_pool([TurnBased])
    assert info.value.command == "make"
    with pytest.raises(EnvError, match="neither a PettingZoo parallel env nor an RLlib-style"):
        await make_pool([lambda: MultiAgent(object())])

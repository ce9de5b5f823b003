"""Spaces without a fixed shape (Text, Sequence, Graph, OneOf, custom, nested in Dict / Tuple)
in aenvs.gymnasium.AsyncVectorEnv: step for step equal to gymnasium's own
AsyncVectorEnv(shared_memory=False) on every executor, batched as gymnasium batches them."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv as GymAsyncVectorEnv, AutoresetMode

from aenvs.gymnasium import AsyncVectorEnv
from tests.vector.comparison import Trajectory, record, replay
from tests.vector.space_envs import MIXED_SPACES, OBJECT_SPACES, ObjectSpaceEnv

NUM_ENVS = 3
MODES = list(AutoresetMode)
PAIRS = [(name, name) for name in OBJECT_SPACES] + [("dict", "tuple_of_objects"), ("seq_box", "custom")]


def env_fns(observation_space: str, action_space: str) -> list[Callable[[], gym.Env[Any, Any]]]:
    return [
        functools.partial(ObjectSpaceEnv, observation_space, action_space, truncate=i % 2 == 1)
        for i in range(NUM_ENVS)
    ]


@pytest.fixture
def make_vec(executor: str) -> Iterator[Callable[..., AsyncVectorEnv]]:
    """``envs = make_vec(observation_space, action_space, **options)`` on the test's executor."""
    made: list[AsyncVectorEnv] = []

    def make(observation_space: str, action_space: str, **options: Any) -> AsyncVectorEnv:
        envs = AsyncVectorEnv(env_fns(observation_space, action_space), executor=executor, **options)
        made.append(envs)
        return envs

    yield make
    for envs in made:
        envs.close()


@functools.cache
def gymnasiums_run(
    observation_space: str, action_space: str, mode: AutoresetMode
) -> tuple[Any, Any, Trajectory]:
    """gymnasium's own AsyncVectorEnv on these spaces: its spaces and its recorded run, made
    once for every executor's comparison."""
    # its workers from a fork server, not forked from this process: a child forked from a
    # process connected to Ray (the ray executor's tests) can break the driver's connection
    theirs = GymAsyncVectorEnv(
        env_fns(observation_space, action_space),
        shared_memory=False,
        autoreset_mode=mode,
        context="forkserver",
    )
    try:
        return theirs.observation_space, theirs.action_space, record(theirs, mode, steps=25, seed=7)
    finally:
        theirs.close()


def compare_with_gymnasium(executor: str, observation_space: str, action_space: str) -> None:
    for mode in MODES:
        spaces = gymnasiums_run(observation_space, action_space, mode)
        ours = AsyncVectorEnv(
            env_fns(observation_space, action_space), executor=executor, autoreset_mode=mode
        )
        try:
            assert (ours.observation_space, ours.action_space) == spaces[:2]
            assert replay(ours, spaces[2]) > 3, mode  # episodes ended, autoresets ran
        finally:
            ours.close()


@pytest.mark.parametrize(("observation_space", "action_space"), PAIRS, ids=[f"{o}-{a}" for o, a in PAIRS])
def test_equal_to_gymnasiums_async_vector_env(
    executor: str, observation_space: str, action_space: str
) -> None:
    compare_with_gymnasium(executor, observation_space, action_space)


@pytest.mark.parametrize("space", list(MIXED_SPACES))
def test_equal_to_gymnasium_where_fixed_and_other_parts_share_a_sub_dict(executor: str, space: str) -> None:
    compare_with_gymnasium(executor, space, space)


def test_batches_are_tuples_of_each_envs_value(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec("dict", "dict")
    obs, _ = envs.reset(seed=0)
    assert obs in envs.observation_space
    assert isinstance(obs["pos"], np.ndarray) and obs["pos"].shape == (NUM_ENVS, 2)
    assert isinstance(obs["text"], tuple) and all(isinstance(t, str) for t in obs["text"])
    assert all(isinstance(t, tuple) for t in obs["tokens"])
    assert all(isinstance(g, gym.spaces.GraphInstance) for g in obs["inner"]["graph"])
    assert all(isinstance(c, tuple) and len(c) == 2 for c in obs["inner"]["choice"])
    obs, *_ = envs.step(envs.action_space.sample())
    assert obs in envs.observation_space


def test_stacked_sequences_come_back_as_arrays_of_their_dtype(
    make_vec: Callable[..., AsyncVectorEnv],
) -> None:
    envs = make_vec("seq_dict_stacked", "seq_discrete_stacked")
    for _ in range(5):  # lengths differ between envs, and sometimes agree
        obs, *_ = envs.step(envs.action_space.sample())
        assert obs in envs.observation_space
        for value in obs:
            assert value["a"].dtype == np.float32 and value["b"].dtype == np.int64
            assert len(value["a"]) == len(value["b"])


def test_returned_observations_are_copies(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec("graph", "text")
    obs, _ = envs.reset(seed=0)
    kept = [g.nodes.copy() for g in obs]
    for g in obs:
        g.nodes[:] = 0.5
    part, _ = envs.reset(options={"reset_mask": np.array([True, False, False])})
    for g, before in zip(part[1:], kept[1:], strict=True):  # the kept rows, untouched by the caller
        assert np.array_equal(g.nodes, before)


def test_observation_modes(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec("text", "text", observation_mode="different")
    assert isinstance(envs.observation_space, gym.spaces.Tuple)
    obs, _ = envs.reset(seed=0)
    assert obs in envs.observation_space
    single = gym.spaces.Text(6)
    custom = make_vec("text", "text", observation_mode=(gym.spaces.Tuple([single] * NUM_ENVS), single))
    obs, _ = custom.reset(seed=0)
    assert obs in custom.observation_space


@pytest.mark.parametrize(
    ("space", "actions", "error", "words"),
    [
        ("text", ("ok", 3, "ok"), TypeError, ["env 1", "'action'", "must be a str"]),
        ("text", ("ok", "ok", "x" * 7), ValueError, ["env 2", "'action'", "length 7"]),
        ("text", ("a", "b"), ValueError, ["actions have 2 values, expected 3"]),
        ("text", "abc", TypeError, ["takes a batch of 3 actions", "the single str"]),
        ("seq_discrete", ((1,), 2, ()), TypeError, ["env 1", "'action'", "a sequence"]),
        ("graph", (None, None, None), ValueError, ["env 0", "'action'", "no value"]),
        ("oneof", ((0, 1), (7, 1), (0, 2)), TypeError, ["env 1", "'action'", "(index, value) pair"]),
        ("dict", {"text": ("a", "b", "c")}, KeyError, ["flags"]),
    ],
)
def test_bad_actions_are_refused_before_dispatch_and_the_env_stays_usable(
    make_vec: Callable[..., AsyncVectorEnv],
    space: str,
    actions: Any,
    error: type[Exception],
    words: list[str],
) -> None:
    envs = make_vec(space, space)
    envs.reset(seed=0)
    with pytest.raises(error) as caught:
        envs.step(actions)
    for word in words:
        assert word in str(caught.value)
    envs.step(envs.action_space.sample())  # nothing was dispatched: the next step runs


def test_a_graph_given_where_text_is_due_names_the_key(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec("dict", "dict")
    envs.reset(seed=1)
    actions = envs.action_space.sample()
    actions["text"] = (actions["text"][0], actions["inner"]["graph"][0], actions["text"][2])
    with pytest.raises(TypeError, match=re.escape("env 1: 'action.text' must be a str")):
        envs.step(actions)
    envs.step(envs.action_space.sample())

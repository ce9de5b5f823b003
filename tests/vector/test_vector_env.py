"""aenvs.gymnasium.AsyncVectorEnv against gymnasium's vector API, on every executor.

Modelled on gymnasium's own tests/vector/: creation, reset / step shapes and dtypes per
space, the autoreset modes, partial resets, calls, errors, and step-for-step equality
with SyncVectorEnv.
"""

from __future__ import annotations

import functools
import multiprocessing
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from aenvs import EnvError
from aenvs._errors import EnvTimeoutError, VectorEnvTimeoutError
from aenvs.gymnasium import AsyncVectorEnv
from tests.helpers import Gate
from tests.vector.comparison import run_both
from tests.vector.vector_envs import (
    SPACES,
    CoroutineSpaceEnv,
    FailingEnv,
    GatedSpaceEnv,
    SpaceEnv,
)

NUM_ENVS = 4
MODES = list(AutoresetMode)


def space_env_fns(n: int = NUM_ENVS, **kwargs: Any) -> list[Callable[[], gym.Env]]:
    return [functools.partial(SpaceEnv, **kwargs)] * n


@pytest.fixture
def make_vec(executor: str) -> Iterator[Callable[..., AsyncVectorEnv]]:
    """``envs = make_vec(env_fns, **options)`` on the test's executor, closed afterwards."""
    made: list[AsyncVectorEnv] = []

    def make(env_fns: Any, **options: Any) -> AsyncVectorEnv:
        envs = AsyncVectorEnv(env_fns, executor=executor, **options)
        made.append(envs)
        return envs

    yield make
    for envs in made:
        envs.close()


def assert_batch(value: Any, space: gym.Space) -> None:
    """``value`` is a member of the batched ``space`` with exactly its dtypes and types."""
    assert space.contains(value), f"{value!r} not in {space}"
    if isinstance(space, gym.spaces.Dict):
        assert type(value) is dict and list(value) == list(space.spaces)
        for k, sub in space.spaces.items():
            assert_batch(value[k], sub)
    elif isinstance(space, gym.spaces.Tuple):
        assert type(value) is tuple
        for v, sub in zip(value, space.spaces, strict=True):
            assert_batch(v, sub)
    else:
        assert isinstance(value, np.ndarray) and value.dtype == space.dtype and value.shape == space.shape


# -- creation -------------------------------------------------------------------------------


def test_create_is_a_vector_env_with_batched_spaces(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(observation_space="dict", action_space="tuple"))
    assert isinstance(envs, VectorEnv)
    assert envs.num_envs == NUM_ENVS
    assert envs.single_observation_space == SPACES["dict"]
    assert envs.single_action_space == SPACES["tuple"]
    assert envs.observation_space == gym.vector.utils.batch_space(SPACES["dict"], NUM_ENVS)
    assert envs.action_space == gym.vector.utils.batch_space(SPACES["tuple"], NUM_ENVS)
    assert envs.metadata == {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}
    assert envs.render_mode is None
    assert repr(envs) == f"AsyncVectorEnv(num_envs={NUM_ENVS})"


def test_from_id_builds_like_make_vec(executor: str) -> None:
    envs = AsyncVectorEnv.from_id(
        "Pendulum-v1", 3, executor=executor, autoreset_mode="SameStep", g=1.62, max_episode_steps=7
    )
    try:
        reference = gym.make_vec("Pendulum-v1", 3, vectorization_mode="sync", g=1.62, max_episode_steps=7)
        assert repr(envs) == "AsyncVectorEnv(Pendulum-v1, num_envs=3)"
        assert envs.spec is not None and envs.spec.kwargs["g"] == 1.62 and envs.spec.kwargs["num_envs"] == 3
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        assert envs.get_attr("g") == (1.62, 1.62, 1.62)
        assert isinstance(reference, SyncVectorEnv)
        # each env's own spec: the aenvs wrapper does not appear in its additional_wrappers
        assert envs.get_attr("spec") == reference.get_attr("spec")
        assert data_equivalence(envs.reset(seed=3), reference.reset(seed=3), exact=True)
        reference.close()
    finally:
        envs.close()


def test_gymnasiums_constructor_arguments_are_accepted_in_its_order(executor: str) -> None:
    """A script passing gymnasium's own arguments (shared_memory, copy, context, daemon,
    observation_mode, autoreset_mode), also positionally, runs unchanged; its results match."""
    fns = [lambda: gym.make("CartPole-v1")] * 2
    envs = AsyncVectorEnv(fns, False, True, "spawn", True, None, "same", "SameStep", executor=executor)
    try:
        reference = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        assert (envs.shared_memory, envs.context, envs.daemon) == (False, "spawn", True)
        assert data_equivalence(envs.reset(seed=5), reference.reset(seed=5), exact=True)
        actions = np.array([1, 0])
        assert data_equivalence(envs.step(actions), reference.step(actions), exact=True)
        reference.close()
    finally:
        envs.close()
    with pytest.raises(ValueError, match=r"worker=\.\.\.\) is not supported"):
        AsyncVectorEnv(fns, worker=lambda *args: None, executor=executor)


def test_create_refuses_differing_spaces_in_gymnasiums_words(executor: str) -> None:
    """Code matches on gymnasium's messages: they are kept, with the env and spaces after them."""
    env_fns = [*space_env_fns(2), functools.partial(SpaceEnv, observation_space="box64")]
    same = (
        "AsyncVectorEnv(..., observation_mode='same') however some of the sub-environments observation "
        "spaces are not equivalent. If this is intentional, use `observation_mode='different'` instead."
    )
    with pytest.raises(RuntimeError, match=re.escape(same)) as caught:
        AsyncVectorEnv(env_fns, executor=executor)
    assert "Env 2" in str(caught.value) and "float64" in str(caught.value)
    different = (
        "AsyncVectorEnv(..., observation_mode='different' or custom space) however the sub-environment's "
        "observation spaces do not share a common shape and dtype."
    )
    custom = (gym.vector.utils.batch_space(SPACES["box"], 3), SPACES["box"])
    with pytest.raises(RuntimeError, match=re.escape(different)):
        AsyncVectorEnv(env_fns, executor=executor, observation_mode=custom)
    env_fns = [*space_env_fns(2), functools.partial(SpaceEnv, action_space="discrete")]
    action = (
        f"Some environments have an action space different from `{SPACES['box']}`. In order to batch "
        "actions, the action spaces from all environments must be equal."
    )
    with pytest.raises(RuntimeError, match=re.escape(action)) as caught:
        AsyncVectorEnv(env_fns, executor=executor)
    assert "Env 2" in str(caught.value) and "Discrete(5, start=-2)" in str(caught.value)


# -- reset and step: shapes and dtypes ------------------------------------------------------


@pytest.mark.parametrize("space", list(SPACES))
def test_reset_and_step_shapes_and_dtypes(make_vec: Callable[..., AsyncVectorEnv], space: str) -> None:
    envs = make_vec(space_env_fns(observation_space=space, action_space=space))
    obs, infos = envs.reset(seed=0)
    assert_batch(obs, envs.observation_space)
    assert infos["resets"].dtype == np.int64 and infos["_resets"].all()
    envs.action_space.seed(0)
    for _ in range(8):  # past the end of every first episode
        obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        assert_batch(obs, envs.observation_space)
        for flags in (terminations, truncations):
            assert flags.dtype == np.bool_ and flags.shape == (NUM_ENVS,)
        assert rewards.dtype == np.float64 and rewards.shape == (NUM_ENVS,)


def test_actions_are_cast_to_the_action_space_dtype(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(action_space="discrete"))
    envs.reset(seed=0)
    envs.step(np.array([-2, 0, 1, 2], dtype=np.int32))
    envs.step([2, 2, 2, 2])  # a list too
    with pytest.raises(ValueError, match=r"^actions have shape \(5,\), expected \(4,\)"):
        envs.step(np.zeros(NUM_ENVS + 1, dtype=np.int64))
    envs.step(np.zeros(NUM_ENVS, dtype=np.int64))  # usable after a refused step


@pytest.mark.parametrize("space", ["discrete", "box", "dict", "tuple"])
def test_a_scalar_action_is_a_type_error(make_vec: Callable[..., AsyncVectorEnv], space: str) -> None:
    """As gymnasium's vector envs: a single action where a batch is due is a TypeError."""
    envs = make_vec(space_env_fns(action_space=space))
    envs.reset(seed=0)
    with pytest.raises(TypeError, match=rf"AsyncVectorEnv.step takes a batch of {NUM_ENVS} actions"):
        envs.step(0)
    with pytest.raises(TypeError, match="a batch of"):
        envs.step_async(np.int64(1))
    envs.step(envs.action_space.sample())  # usable after a refused step


def test_returned_observations_are_copies(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns())
    obs, _ = envs.reset(seed=0)
    kept = obs.copy()
    obs[:] = 5  # the caller's arrays are theirs: a partial reset must not see this
    mask = np.array([True, False, False, False])
    partial, _ = envs.reset(options={"reset_mask": mask})
    np.testing.assert_array_equal(partial[~mask], kept[~mask])


# -- autoreset modes ------------------------------------------------------------------------


def episode(envs: AsyncVectorEnv) -> tuple[Any, ...]:
    """Step with fixed actions until env 0's first episode ends; the last step's results."""
    envs.reset(seed=7)
    for _ in range(10):
        out = envs.step(np.zeros((NUM_ENVS, 3), dtype=np.float32))
        if out[2][0]:
            return out
    raise AssertionError("env 0 never terminated")


def test_next_step_autoreset_resets_on_the_step_after(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(), autoreset_mode=AutoresetMode.NEXT_STEP)
    episode(envs)
    _, rewards, terminations, truncations, infos = envs.step(np.zeros((NUM_ENVS, 3), dtype=np.float32))
    assert rewards[0] == 0.0 and not terminations[0] and not truncations[0]
    assert infos["_resets"][0] and infos["resets"][0] == 2  # env 0's info is its reset's
    assert not infos["_t"][0] and infos["t"][0] == 0


def test_same_step_autoreset_returns_the_final_observation(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(), autoreset_mode=AutoresetMode.SAME_STEP)
    obs, _, _, _, infos = episode(envs)
    assert infos["_final_obs"][0] and infos["_final_info"][0]
    final = infos["final_obs"][0]
    assert final.dtype == np.float32 and final.shape == (3,) and not np.array_equal(final, obs[0])
    assert infos["final_info"]["ended"]["length"][0] == infos["final_info"]["t"][0]
    assert infos["resets"][0] == 2  # the reset's info beside the final one
    obs, rewards, *_ = envs.step(np.zeros((NUM_ENVS, 3), dtype=np.float32))
    assert infos["resets"][0] == 2 and rewards[0] != 0.0  # a normal step of the new episode


def test_disabled_autoreset_needs_a_partial_reset(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(), autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=7)
    zeros = np.zeros((NUM_ENVS, 3), dtype=np.float32)
    done = np.zeros(NUM_ENVS, dtype=np.bool_)
    while not done.any():
        _, _, terminations, truncations, _ = envs.step(zeros)
        done = terminations | truncations
    with pytest.raises(AssertionError, match="DISABLED"):
        envs.step(zeros)
    _, infos = envs.reset(options={"reset_mask": done})
    np.testing.assert_array_equal(infos["_resets"], done)
    _, rewards, *_ = envs.step(zeros)
    assert (rewards != 0.0).all()  # every env stepped, none was reset


# -- partial resets -------------------------------------------------------------------------


def test_reset_mask_resets_only_those_envs(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns(observation_space="dict"))
    before, _ = envs.reset(seed=0)
    mask = np.array([False, True, False, True])
    obs, infos = envs.reset(seed=[10, 11, 12, 13], options={"reset_mask": mask, "level": 2})
    assert data_equivalence(obs["pos"][~mask], before["pos"][~mask], exact=True)
    assert not np.array_equal(obs["pos"][mask], before["pos"][mask])
    np.testing.assert_array_equal(infos["_resets"], mask)
    np.testing.assert_array_equal(infos["resets"], [0, 2, 0, 2])
    assert list(infos["options"][mask]) == [["level"], ["level"]]  # the mask is not passed on
    assert envs.get_attr("np_random_seed") == (0, 11, 2, 13)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        ([True, False, True, False], TypeError, "must be a numpy array"),
        (np.ones(3, dtype=np.bool_), ValueError, "must have shape"),
        (np.ones(NUM_ENVS, dtype=np.int64), TypeError, "dtype=np.bool_"),
        (np.zeros(NUM_ENVS, dtype=np.bool_), ValueError, "at least one True"),
    ],
)
def test_reset_mask_is_checked(
    make_vec: Callable[..., AsyncVectorEnv], mask: Any, error: type, match: str
) -> None:
    envs = make_vec(space_env_fns())
    envs.reset(seed=0)
    with pytest.raises(error, match=match):
        envs.reset(options={"reset_mask": mask})
    envs.step(envs.action_space.sample())  # still usable


def test_reset_seed_list_must_match_num_envs(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns())
    with pytest.raises(ValueError, match="length must match num_envs"):
        envs.reset(seed=[1, 2])
    envs.reset(seed=[1, None, 3, None])
    assert envs.get_attr("np_random_seed")[::2] == (1, 3)


# -- call, get_attr, set_attr ---------------------------------------------------------------


def test_call_get_attr_set_attr(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns())
    envs.reset(seed=0)
    assert envs.call("double", 21) == (42,) * NUM_ENVS
    assert envs.call("double", x=1) == (2,) * NUM_ENVS
    assert envs.call("label") == ("env",) * NUM_ENVS  # not callable: returned as is
    assert envs.get_attr("length") == tuple(envs.call("length"))
    frames = envs.render()
    assert frames is not None and len(frames) == NUM_ENVS and frames[0].shape == (2, 2, 3)
    envs.set_attr("label", "same")
    assert envs.get_attr("label") == ("same",) * NUM_ENVS
    envs.set_attr("label", ["a", "b", "c", "d"])
    assert envs.get_attr("label") == ("a", "b", "c", "d")
    envs.set_attr("new_attribute", (1, 2, 3, 4))  # set on the env, as gymnasium does
    assert envs.get_attr("new_attribute") == (1, 2, 3, 4)
    with pytest.raises(ValueError, match="length equal to the number of environments"):
        envs.set_attr("label", ["a", "b"])
    assert len(envs.np_random) == NUM_ENVS and envs.np_random_seed == (0, 1, 2, 3)


def test_gymnasium_vector_wrappers_work_on_it(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = gym.wrappers.vector.RecordEpisodeStatistics(make_vec(space_env_fns()))
    envs.reset(seed=0)
    finished = 0
    for _ in range(12):
        *_, infos = envs.step(envs.action_space.sample())
        finished += int(infos.get("_episode", np.zeros(NUM_ENVS, bool)).sum())
    assert finished >= NUM_ENVS


# -- errors ---------------------------------------------------------------------------------


def test_closed_env_raises(executor: str) -> None:
    envs = AsyncVectorEnv(space_env_fns(), executor=executor)
    envs.reset(seed=0)
    envs.close()
    assert envs.closed
    for call in (
        lambda: envs.reset(),
        lambda: envs.step(envs.action_space.sample()),
        lambda: envs.step_async(envs.action_space.sample()),
        lambda: envs.step_wait(),
        lambda: envs.call("double", 1),
        lambda: envs.get_attr("label"),
        lambda: envs.set_attr("label", "x"),
    ):
        with pytest.raises(ClosedEnvironmentError):
            call()
    envs.close()  # idempotent


@pytest.mark.parametrize("call", ["step", "reset"])
def test_close_with_a_call_in_flight_warns_as_gymnasium(executor: str, call: str) -> None:
    envs = AsyncVectorEnv(space_env_fns(), executor=executor)
    envs.reset(seed=0)
    if call == "step":
        envs.step_async(envs.action_space.sample())
    else:
        envs.reset_async(seed=1)
    warning = f"Calling `close` while waiting for a pending call to `{call}` to complete."
    with pytest.warns(UserWarning, match=re.escape(warning)):
        envs.close()
    assert envs.closed


def test_split_step_state_machine(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    envs = make_vec(space_env_fns())
    envs.reset(seed=0)
    with pytest.raises(NoAsyncCallError):
        envs.step_wait()
    with pytest.raises(NoAsyncCallError):
        envs.reset_wait()
    envs.step_async(envs.action_space.sample())
    with pytest.raises(AlreadyPendingCallError):
        envs.step_async(envs.action_space.sample())
    with pytest.raises(AlreadyPendingCallError):
        envs.reset()
    with pytest.raises(AlreadyPendingCallError):
        envs.call("double", 1)
    obs, *_ = envs.step_wait(timeout=30)
    assert obs.shape == (NUM_ENVS, 3)
    envs.reset_async(seed=1)
    with pytest.raises(NoAsyncCallError):
        envs.step_wait()
    obs, _ = envs.reset_wait()
    assert obs.shape == (NUM_ENVS, 3)


def test_env_error_surfaces_and_the_other_envs_stay_usable(make_vec: Callable[..., AsyncVectorEnv]) -> None:
    env_fns = [*space_env_fns(2), functools.partial(FailingEnv, fail_at=2), *space_env_fns(1)]
    envs = make_vec(env_fns)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    with pytest.raises(EnvError, match="boom") as caught:
        envs.step(envs.action_space.sample())
    assert caught.value.env_index == 2
    obs, _ = envs.reset(seed=1)  # every env is free again
    assert obs.shape == (NUM_ENVS, 3)
    envs.step(envs.action_space.sample())


def test_an_interrupt_inside_an_env_leaves_the_step_to_collect(
    make_vec: Callable[..., AsyncVectorEnv], executor: str
) -> None:
    """KeyboardInterrupt raised inside an env's step: on the inline executor (the env runs in
    the caller's thread) it reaches the caller and the step stays to collect with
    ``step_wait`` (that env's result an EnvError); elsewhere it is the env's EnvError. Every
    env steps again after a reset."""
    env_fns = [
        *space_env_fns(1),
        functools.partial(FailingEnv, fail_at=2, error=KeyboardInterrupt("Ctrl-C in the env")),
        *space_env_fns(2),
    ]
    envs = make_vec(env_fns)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    if executor == "inline":
        with pytest.raises(KeyboardInterrupt):
            envs.step(envs.action_space.sample())
        with pytest.raises(AlreadyPendingCallError):
            envs.reset(seed=1)
        with pytest.raises(EnvError, match="Ctrl-C in the env") as caught:
            envs.step_wait()
    else:
        with pytest.raises(EnvError, match="Ctrl-C in the env") as caught:
            envs.step(envs.action_space.sample())
    assert caught.value.env_index == 1
    obs, _ = envs.reset(seed=1)
    assert obs.shape == (NUM_ENVS, 3)
    envs.step(envs.action_space.sample())


def test_import_does_not_load_torch() -> None:
    """Worker processes import this module to build their envs: it must stay light."""
    code = "import sys, aenvs.gymnasium; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- equivalence with SyncVectorEnv ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_equal_to_sync_vector_env_on_rich_spaces(executor: str, mode: AutoresetMode) -> None:
    env_fns = [
        functools.partial(SpaceEnv, observation_space="nested", action_space="dict", truncate=i % 2 == 1)
        for i in range(NUM_ENVS)
    ]
    async_envs = AsyncVectorEnv(env_fns, executor=executor, autoreset_mode=mode)
    sync_envs = SyncVectorEnv(env_fns, autoreset_mode=mode)
    try:
        assert run_both(async_envs, sync_envs, mode) > 50  # many resets of every kind
    finally:
        async_envs.close()
        sync_envs.close()


@pytest.mark.parametrize("observation_space", ["box", "tuple", "nested", "narrow"])
def test_steps_of_fixed_shape_observations_are_received_as_columns(
    executor: str, observation_space: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``step`` takes its results as columns (no TensorDict built), with the same returns."""
    env_fns = [
        functools.partial(SpaceEnv, observation_space=observation_space, truncate=i % 2 == 1)
        for i in range(NUM_ENVS)
    ]
    async_envs = AsyncVectorEnv(env_fns, executor=executor)
    sync_envs = SyncVectorEnv(env_fns)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("step received its results as a TensorDict")

    monkeypatch.setattr(async_envs.pool, "async_step_recv", refuse)
    try:
        assert run_both(async_envs, sync_envs, AutoresetMode.NEXT_STEP) > 10
    finally:
        async_envs.close()
        sync_envs.close()


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_equal_to_sync_vector_env_on_classic_control(executor: str, mode: AutoresetMode) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("CartPole-v1", {}),
        ("Pendulum-v1", {"max_episode_steps": 30}),
    ]
    for env_id, kwargs in cases:
        async_envs = AsyncVectorEnv.from_id(
            env_id, NUM_ENVS, executor=executor, autoreset_mode=mode, **kwargs
        )
        sync_envs = gym.make_vec(
            env_id, NUM_ENVS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}, **kwargs
        )
        try:
            assert run_both(async_envs, sync_envs, mode) > 0
        finally:
            async_envs.close()
            sync_envs.close()


def test_equal_to_sync_vector_env_on_integer_spaces_of_other_dtypes(executor: str) -> None:
    env_fns = [functools.partial(SpaceEnv, observation_space="narrow", action_space="narrow")] * NUM_ENVS
    async_envs = AsyncVectorEnv(env_fns, executor=executor)
    sync_envs = SyncVectorEnv(env_fns)
    try:
        assert run_both(async_envs, sync_envs, AutoresetMode.NEXT_STEP, steps=30) > 0
    finally:
        async_envs.close()
        sync_envs.close()


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_coroutine_envs_equal_to_sync_vector_env_on_plain_ones(executor: str, mode: AutoresetMode) -> None:
    """``async def`` step and reset are awaited, autoresets included; the results are the plain envs'."""
    kwargs = [
        {"observation_space": "nested", "action_space": "dict", "truncate": i % 2 == 1}
        for i in range(NUM_ENVS)
    ]
    async_envs = AsyncVectorEnv(
        [functools.partial(CoroutineSpaceEnv, **kw) for kw in kwargs], executor=executor, autoreset_mode=mode
    )
    sync_envs = SyncVectorEnv([functools.partial(SpaceEnv, **kw) for kw in kwargs], autoreset_mode=mode)
    try:
        assert run_both(async_envs, sync_envs, mode, steps=40) > 10
        assert async_envs.call("double", 2) == (4,) * NUM_ENVS
    finally:
        async_envs.close()
        sync_envs.close()


def wait_until_only_the_gated_env_is_late(wait: Callable[[], Any]) -> VectorEnvTimeoutError:
    """Call ``wait`` (a ``*_wait`` with a short timeout) until the gated env 2 is the only one
    not answered (the others may take a while to, on a busy machine); its last error."""
    deadline = time.monotonic() + 30
    while True:
        with pytest.raises(multiprocessing.TimeoutError) as caught:
            wait()
        error = caught.value
        assert isinstance(error, VectorEnvTimeoutError) and 2 in error.unanswered
        if error.unanswered == [2] or time.monotonic() > deadline:
            return error


def test_wait_timeouts_are_gymnasiums_timeout_error_naming_the_env(
    make_vec: Callable[..., AsyncVectorEnv], tmp_path: Path
) -> None:
    """gymnasium raises multiprocessing.TimeoutError and code catches that; the results stay
    collectable."""
    reset_gate, step_gate = Gate(str(tmp_path)), Gate(str(tmp_path))
    # one env per worker: a worker answers for all of its envs at once
    envs = make_vec(
        [*space_env_fns(2), functools.partial(GatedSpaceEnv, reset_gate, step_gate), *space_env_fns(1)],
        envs_per_worker=1,
    )
    envs.reset_async(seed=0)
    error = wait_until_only_the_gated_env_is_late(lambda: envs.reset_wait(timeout=0.1))
    assert isinstance(error, EnvTimeoutError) and isinstance(error, TimeoutError)
    assert (error.env_index, error.command) == (2, "reset")
    assert str(error).startswith("The call to `reset_wait` has timed out after 0.1 second(s).")
    assert "Env 2 of 4 has not answered; the results stay collectable" in str(error)
    reset_gate.open()
    obs, _ = envs.reset_wait(timeout=30)  # nothing was lost
    assert obs.shape == (NUM_ENVS, 3)
    envs.step_async(envs.action_space.sample())
    with pytest.raises(
        VectorEnvTimeoutError, match=r"^The call to `step_wait` has timed out after 0.2"
    ) as caught:
        envs.step_wait(timeout=0.2)
    assert (caught.value.env_index, caught.value.command, caught.value.timeout) == (2, "step", 0.2)
    step_gate.open()
    obs, rewards, *_ = envs.step_wait()
    assert obs.shape == (NUM_ENVS, 3) and rewards.shape == (NUM_ENVS,)

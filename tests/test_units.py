"""Pure parts: space layout, seed chain, buffers, public names."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import aenvs
from aenvs import executors
from aenvs._buffers import Buffers
from aenvs._rows import pick_rows, put_rows, row_items
from aenvs._seeding import next_seed, seed_chain
from aenvs._specs import EnvSpec, space_leaves


def test_public_names_are_exported_and_sorted() -> None:
    assert aenvs.__all__ == sorted(aenvs.__all__)
    for name in aenvs.__all__:
        assert getattr(aenvs, name) is not None
    for name in ("AsyncEnvPool", "Env", "EnvError", "EnvBusyError", "PoolClosedError", "step_mdp"):
        assert name in aenvs.__all__


def test_error_tree() -> None:
    assert issubclass(aenvs.EnvTimeoutError, aenvs.EnvError)
    assert issubclass(aenvs.EnvCrashedError, aenvs.EnvError)
    for cls in (aenvs.EnvError, aenvs.EnvBusyError, aenvs.PoolClosedError):
        assert issubclass(cls, aenvs.AenvsError)


def test_env_error_survives_pickling() -> None:
    import pickle

    err = aenvs.EnvError(4, "step", "Traceback...\nKeyError: 'x'", "builtins.KeyError")
    back = pickle.loads(pickle.dumps(err))
    assert (back.env_index, back.command, back.exc_type) == (4, "step", "builtins.KeyError")
    assert str(back) == str(err)


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (spaces.Box(-1, 1, (2, 3), np.float32), [(("x",), (2, 3), "float32")]),
        (spaces.Discrete(5), [(("x",), (), "int64")]),
        (spaces.MultiDiscrete([2, 3]), [(("x",), (2,), "int64")]),
        (spaces.MultiBinary(4), [(("x",), (4,), "int8")]),
        (
            spaces.Dict({"b": spaces.Discrete(2), "a": spaces.Box(0, 1, (1,), np.float64)}),
            [(("x", "a"), (1,), "float64"), (("x", "b"), (), "int64")],
        ),
        (
            spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(2))),
            [(("x", "0"), (), "int64"), (("x", "1"), (2,), "int8")],
        ),
        (spaces.Text(5), []),
    ],
)
def test_space_leaves(space: spaces.Space, expected: list) -> None:
    got = [(leaf.key, leaf.shape, str(leaf.dtype)) for leaf in space_leaves(space, ("x",))]
    assert got == expected


def test_dict_observation_lives_at_the_root() -> None:
    spec = EnvSpec.from_spaces(
        spaces.Dict({"pixels": spaces.Box(0, 255, (2, 2), np.uint8)}), spaces.Discrete(2)
    )
    assert spec.observation_keys == (("pixels",),)
    assert [leaf.key for leaf in spec.action_leaves] == [("action",)]


def test_layout_difference_names_the_key() -> None:
    a = EnvSpec.from_spaces(spaces.Box(-1, 1, (4,)), spaces.Discrete(2))
    b = EnvSpec.from_spaces(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    assert a.layout_difference(a) is None
    assert "'observation' has shape (4,)" in (a.layout_difference(b) or "")


def test_seed_chain_is_torchrls() -> None:
    # TorchRL's seed_generator: default_rng(seed).bytes(8), big endian, modulo 2**32 - 1
    expected = int.from_bytes(np.random.default_rng(3).bytes(8), "big") % (2**32 - 1)
    assert next_seed(3) == expected
    seeds, after = seed_chain(3, 3)
    assert seeds == [3, expected, next_seed(expected)]
    assert after == next_seed(seeds[-1])


def test_buffers_group_envs_by_layout() -> None:
    a = EnvSpec.from_spaces(spaces.Box(-1, 1, (4,)), spaces.Discrete(2))
    b = EnvSpec.from_spaces(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (1,)))
    buffers = Buffers.allocate([a, b, a])
    assert buffers.location == [(0, 0), (1, 0), (0, 1)]
    rows = buffers.rows(2)
    rows.step[("observation",)][...] = 7
    assert buffers.groups[0].step[("observation",)][1].tolist() == [7, 7, 7, 7]
    rows.step[("reward",)][0] = 1.5  # 0-d-safe views write through
    assert buffers.groups[0].step[("reward",)][1, 0] == 1.5


def test_step_mdp_moves_next_to_the_root() -> None:
    import torch
    from tensordict import TensorDict

    td = TensorDict(
        {
            "observation": torch.zeros(2, 3),
            "action": torch.ones(2),
            "env_index": torch.tensor([4, 7]),
            "next": {
                "observation": torch.ones(2, 3),
                "reward": torch.ones(2, 1),
                "done": torch.ones(2, 1, dtype=torch.bool),
            },
        },
        batch_size=[2],
    )
    nxt = aenvs.step_mdp(td)
    assert sorted(nxt.keys()) == ["done", "env_index", "observation"]
    assert torch.equal(nxt["observation"], torch.ones(2, 3))
    assert nxt["env_index"].tolist() == [4, 7]
    assert "reward" in aenvs.step_mdp(td, keep_reward=True).keys()


@pytest.mark.parametrize("executor", ["ThreadExecutor", "ProcessExecutor", "RayExecutor"])
@pytest.mark.parametrize("option", ["num_workers", "envs_per_worker"])
def test_worker_counts_under_one_are_refused_naming_the_option(executor: str, option: str) -> None:
    cls = getattr(executors, executor)
    with pytest.raises(ValueError, match=f"^{option} must be >= 1, got 0$"):
        cls(**{option: 0})


class _ContextFactory:
    """A factory object that takes the EnvContext, unhashable (it defines __eq__ only)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ContextFactory)

    def __call__(self, context: aenvs.EnvContext) -> str:
        self.seen = context.env_index
        return "CartPole-v1"


def test_build_env_passes_the_context_to_each_kind_of_factory() -> None:
    """Whether a factory takes the context is looked up once per factory and kept (weakly);
    factories that cannot be kept (unhashable) are inspected each time, with the same answer."""
    from aenvs._adapters import build_env

    def with_context(context: aenvs.EnvContext) -> str:
        assert context.env_index in (0, 1)
        return "CartPole-v1"

    def without_context() -> str:
        return "CartPole-v1"

    unhashable = _ContextFactory()
    for i in (0, 1):  # the second time from the cache where there is one
        context = aenvs.EnvContext(i, 0, 2)
        for factory in (with_context, without_context, unhashable):
            env = build_env(factory, context)
            assert env.spec is not None and env.spec.id == "CartPole-v1"
            env.close()
        assert unhashable.seen == i


_ROW_ARRAYS = [
    np.arange(24, dtype=np.float32).reshape(6, 4),
    np.arange(48, dtype=np.int16).reshape(6, 2, 4),
    np.arange(6, dtype=np.int64),
    np.arange(6) % 2 == 0,
    np.arange(36, dtype=np.float64).reshape(6, 6)[:, ::2],  # rows not contiguous
    np.array([[f"a{i}", i] for i in range(6)], dtype=object),
    np.zeros((6, 0), np.float32),
]


@pytest.mark.parametrize("array", _ROW_ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
@pytest.mark.parametrize("rows", [[5, 0, 3], [2], [], list(range(6))[::-1]])
def test_rows_are_picked_and_put_as_numpy_indexing_does(array: np.ndarray, rows: list[int]) -> None:
    index = np.array(rows, dtype=np.int64)
    picked = pick_rows(array, index, row_items(array))
    expected = array.take(index, axis=0)
    assert picked.dtype == expected.dtype and picked.shape == expected.shape
    assert (picked == expected).all()
    assert not np.shares_memory(picked, array)  # a copy, as take's

    target, reference = array.copy(), array.copy()
    values = np.flip(expected, axis=0) if len(rows) else expected
    put_rows(target, index, values)
    reference[index] = values
    assert (target == reference).all()


def test_put_rows_broadcasts_and_casts_values_as_setitem_does() -> None:
    array, reference = np.zeros((5, 3), np.float32), np.zeros((5, 3), np.float32)
    put_rows(array, [4, 1], np.float64(2.5))
    reference[[4, 1]] = 2.5
    put_rows(array, [0], np.array([1, 2, 3], dtype=np.int64))
    reference[[0]] = np.array([1, 2, 3])
    assert (array == reference).all()
    with pytest.raises(IndexError):
        pick_rows(array, np.array([5]))

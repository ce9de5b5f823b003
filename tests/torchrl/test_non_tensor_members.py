"""TorchRL envs with non-tensor (``NonTensor``) and tensorclass specs as pool members, on every
executor: text observations arrive as non-tensor entries, text actions go in as lists,
non-tensor stacks or per-env values, and every value matches TorchRL's own ``SerialEnv``."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from aenvs import EnvError
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N, STEPS, SEED = 2, 7, 5
WORDS = (["go", "look"], ["north", "up there"], ["take lamp", "é"])


def _text_env():
    import_torchrl()
    from tests.torchrl.envs import TextEnv

    return TextEnv()


def _tensorclass_env():
    import_torchrl()
    from tests.torchrl.envs import TensorclassEnv

    return TensorclassEnv()


def _batched_text_env():
    return import_torchrl("torchrl.envs").SerialEnv(3, _text_env)


def _texts(td: TensorDictBase, key: str | tuple[str, ...]) -> list[str]:
    value = td[key]
    return list(value) if not isinstance(value, str) else [value]


def _torchrl_run() -> list[tuple[list[str], list[float], list[bool], list[str]]]:
    serial = import_torchrl("torchrl.envs").SerialEnv(N, _text_env)
    try:
        serial.set_seed(SEED)
        td = serial.reset()
        rows = [(_texts(td, "text"), [], [], [])]
        for t in range(STEPS):
            td.set_non_tensor("action", None)  # replaced just below, per env
            td["action"] = WORDS[t % len(WORDS)]
            out, td = serial.step_and_maybe_reset(td)
            rows.append(
                (
                    _texts(out, ("next", "text")),
                    out["next", "reward"].flatten().tolist(),
                    out["next", "done"].flatten().tolist(),
                    _texts(td, "text"),
                )
            )
        return rows
    finally:
        serial.close()


def _action(t: int, form: str) -> object:
    words = WORDS[t % len(WORDS)]
    if form == "list":
        return list(words)
    return NonTensorStack(*(TensorDict({}, []).set_non_tensor("a", w).get("a") for w in words))


@pytest.mark.parametrize("form", ["list", "stack"])
async def test_a_text_env_speaks_text_as_torchrl_serial_env(make_pool, form: str) -> None:
    expected = _torchrl_run()
    pool = await make_pool([_text_env] * N)
    space = pool.env_specs[0].action_space
    assert type(space).__name__ == "NonTensorSpace" and space.contains("any value")
    await pool.set_seed(SEED)
    td = await pool.reset()
    assert isinstance(td.get("text"), NonTensorStack)
    assert _texts(td, "text") == expected[0][0]
    assert td["count"].shape == (N, 1)
    for t in range(STEPS):
        td["action"] = _action(t, form)
        out, td = await pool.step_and_maybe_reset(td)
        got = (
            _texts(out, ("next", "text")),
            out["next", "reward"].flatten().tolist(),
            out["next", "done"].flatten().tolist(),
            _texts(td, "text"),
        )
        assert got == expected[t + 1], t
        assert _texts(out, "action") == list(WORDS[t % len(WORDS)])  # the sent actions, kept
    assert sum(any(row[2]) for row in expected[1:]) >= 2  # episodes ended and were reset


async def test_per_env_text_actions_go_to_their_envs(make_pool) -> None:
    pool = await make_pool([_text_env] * N)
    td = await pool.reset()
    out = await pool.step(td.set("action", ["north", "south"]), env_index=[0, 1])
    assert _texts(out, ("next", "text")) == ["seed 0: north", "seed 0: south"]
    await pool.async_step_send(TensorDict({"action": ["west"]}, [1]), env_index=[1])
    out = await pool.async_step_recv(env_index=[1])
    assert _texts(out, ("next", "text")) == ["seed 0: south west"]


async def test_a_missing_text_action_is_refused_naming_env_and_key(make_pool) -> None:
    pool = await make_pool([_text_env] * N)
    td = await pool.reset()
    with pytest.raises(ValueError, match=r"env 0: the input has no 'action' entry"):
        await pool.step(td)
    assert pool.stats().steps == [0, 0]  # refused before anything was dispatched


async def test_tensorclass_entries_travel_as_their_fields(make_pool) -> None:
    import_torchrl()
    from tests.torchrl.envs import Position

    env = _tensorclass_env()
    env.reset()
    expected = []
    for t in range(3):
        out = env.step(
            TensorDict({"move": Position(x=torch.ones(1) * t, y=-torch.ones(1), batch_size=[])}, [])
        )
        expected.append(
            (out["next", "position"].x.item(), out["next", "position"].y.item(), out["next", "reward"].item())
        )

    pool = await make_pool([_tensorclass_env] * N)
    td = await pool.reset()
    assert isinstance(td["position"], TensorDictBase)
    assert Position.from_tensordict(td["position"]).x.tolist() == [[1.0]] * N
    for t in range(3):
        if t % 2:  # the action as a tensorclass, or as its fields
            move = Position(x=torch.ones(N, 1) * t, y=-torch.ones(N, 1), batch_size=[N])
        else:
            move = TensorDict({"x": torch.ones(N, 1) * t, "y": -torch.ones(N, 1)}, [N])
        td["action"] = TensorDict({"move": move}, [N])
        out = await pool.step(td)
        for i in range(N):
            got = (
                out["next", "position", "x"][i].item(),
                out["next", "position", "y"][i].item(),
                out["next", "reward"][i].item(),
            )
            assert got == pytest.approx(expected[t]), (t, i)


async def test_a_batched_member_with_non_tensor_entries_is_refused_naming_env_and_key(make_pool) -> None:
    with pytest.raises(EnvError, match=r"batch size \[3\] with non-tensor entries \(text, action\)") as info:
        await make_pool([_text_env, _batched_text_env])
    assert info.value.env_index == 1


def test_the_torchrl_wrapper_carries_text_both_ways(executor: str) -> None:
    import_torchrl()
    from aenvs import SerialEnv
    from aenvs.torchrl import AenvsWrapper

    env = AenvsWrapper(SerialEnv(N, _text_env, executor=executor))
    try:
        assert type(env.observation_spec["text"]).__name__ == "NonTensor"
        assert type(env.action_spec).__name__ == "NonTensor"
        td = env.reset()
        td["action"] = ["north", "south"]
        out = env.step(td)
    finally:
        env.close()
    assert _texts(out, ("next", "text")) == ["seed 0: north", "seed 0: south"]
    assert out["next", "reward"].flatten().tolist() == [5.0, 5.0]

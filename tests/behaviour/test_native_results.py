"""What a native env's step may return, written to the same layout on every executor.

The runner writes the common native step result, a plain dict of the env's one
observation entry and the step scalars, straight into the buffers; everything else
(extra entries, tensors, other shapes, missing scalars) goes through the general path.
These check that both give the same results, and the same errors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvContext, EnvError, EnvState

# what the env returns for each action: (description, how the step result is built)
PLAIN, TRUNCATED, NUMPY_SCALARS, WIDER_DTYPE, EXTRA_ENTRY, TENSOR_OBS, TENSORDICT = range(7)
WRONG_SHAPE, NO_REWARD = 7, 8
DONE_ENTRY = 9  # the env's own "done" (ignored: done is terminated or truncated), beside the scalars


def actions(values: list[int]) -> TensorDict:
    return TensorDict(action=torch.tensor(values), batch_size=[len(values)])


def dict_env_fns(num_envs: int, *, asynchronous: bool) -> list[Any]:
    """Envs whose step result for action ``a`` is built as the constants above say; the
    observation is ``[env_index, a, steps]``, the reward ``a / 2``, terminated at ``a == 2``."""

    def make(ctx: EnvContext) -> Any:
        # imported here and the constants bound here: the factory is pickled by value
        import numpy as np
        import torch
        from gymnasium import spaces
        from tensordict import TensorDict

        from aenvs import Env

        truncated, numpy_scalars, wider_dtype, extra_entry = (
            TRUNCATED,
            NUMPY_SCALARS,
            WIDER_DTYPE,
            EXTRA_ENTRY,
        )
        tensor_obs, tensordict, wrong_shape, no_reward = TENSOR_OBS, TENSORDICT, WRONG_SHAPE, NO_REWARD
        done_entry = DONE_ENTRY

        class DictEnv(Env):
            observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
            action_space = spaces.Discrete(10)

            def __init__(self) -> None:
                self.steps = 0

            def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
                self.steps = 0
                return {"observation": np.array([ctx.env_index, -1, 0], np.float32)}

            def _result(self, td: TensorDictBase) -> Any:
                a = int(td["action"].item())
                self.steps += 1
                obs = np.array([ctx.env_index, a, self.steps], np.float32)
                out: dict[str, Any] = {"observation": obs, "reward": a / 2, "terminated": a == numpy_scalars}
                if a == truncated:
                    out["truncated"] = True
                elif a == numpy_scalars:
                    out["reward"], out["terminated"] = np.float32(a / 2), np.bool_(True)
                elif a == wider_dtype:
                    out["observation"] = obs.astype(np.float64)
                elif a == extra_entry:
                    out["note"] = torch.tensor([7.0])
                elif a == tensor_obs:
                    out["observation"] = torch.from_numpy(obs)
                elif a == tensordict:
                    out = TensorDict(out)
                elif a == wrong_shape:
                    out["observation"] = obs[:2]
                elif a == no_reward:
                    del out["reward"]
                elif a == done_entry:
                    out["done"] = False
                return out

        class SyncDictEnv(DictEnv):
            def step(self, td: TensorDictBase) -> Any:
                return self._result(td)

        class AsyncDictEnv(DictEnv):
            async def step(self, td: TensorDictBase) -> Any:
                return self._result(td)

        return AsyncDictEnv() if asynchronous else SyncDictEnv()

    return [make] * num_envs


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain-step", "async-step"])
async def test_every_accepted_step_result_lands_in_the_same_layout(make_pool, asynchronous: bool) -> None:
    cases = [PLAIN, TRUNCATED, NUMPY_SCALARS, WIDER_DTYPE, EXTRA_ENTRY, TENSOR_OBS, TENSORDICT, DONE_ENTRY]
    n = len(cases)
    pool = await make_pool(dict_env_fns(n, asynchronous=asynchronous), stack="lazy")
    await pool.reset()
    for _ in range(2):  # twice: the second round finds the rows the first wrote
        await pool.async_step_send(actions(cases))
        out = await pool.async_step_recv(min_get=n)
        nxt = out["next"]
        for i, a in enumerate(cases):
            assert nxt["observation"][i].tolist() == [float(i), float(a), 1.0], a
            assert nxt["observation"][i].dtype is torch.float32
            assert nxt["reward"][i].tolist() == [a / 2], a
            assert nxt["terminated"][i].item() is (a == NUMPY_SCALARS), a
            assert nxt["truncated"][i].item() is (a == TRUNCATED), a
            assert nxt["done"][i].item() is (a in (NUMPY_SCALARS, TRUNCATED)), a
        assert nxt[cases.index(EXTRA_ENTRY)]["note"].tolist() == [7.0]  # an extra entry travels
        for i in range(n):
            if i != cases.index(EXTRA_ENTRY):
                assert "note" not in nxt[i].keys()
        await pool.reset()  # two episodes ended


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain-step", "async-step"])
async def test_a_bad_plain_result_is_the_env_error_of_the_general_path(make_pool, asynchronous: bool) -> None:
    pool = await make_pool(dict_env_fns(3, asynchronous=asynchronous))
    await pool.reset()
    await pool.async_step_send(actions([PLAIN, WRONG_SHAPE, NO_REWARD]))
    errors: dict[int, str] = {}
    for _ in range(2):  # one error per receive, in the order the envs finished
        with pytest.raises(EnvError) as info:
            await pool.async_step_recv(min_get=3 - len(errors))
        errors[info.value.env_index] = str(info.value) + info.value.remote_traceback
    assert "'observation' with shape (2,), but its space says (3,)" in errors[1]
    assert "must return 'reward' and 'terminated'" in errors[2]
    out = await pool.async_step_recv(min_get=1)  # the good one was kept
    assert out["env_index"].tolist() == [0]
    assert out["next", "observation"].tolist() == [[0.0, float(PLAIN), 1.0]]
    assert pool.env_states == [EnvState.RUN, EnvState.ERROR, EnvState.ERROR]
    await pool.reset()  # usable again afterwards
    await pool.async_step_send(actions([PLAIN] * 3))
    out = await pool.async_step_recv(min_get=3)
    assert out["next", "observation"][:, 0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain-step", "async-step"])
async def test_step_and_maybe_reset_with_plain_results(make_pool, asynchronous: bool) -> None:
    cases = [PLAIN, TRUNCATED, NUMPY_SCALARS, EXTRA_ENTRY]
    n = len(cases)
    pool = await make_pool(dict_env_fns(n, asynchronous=asynchronous), stack="lazy")
    await pool.reset()
    out, nxt = await pool.step_and_maybe_reset(actions(cases))
    ended = [a in (TRUNCATED, NUMPY_SCALARS) for a in cases]
    assert out["next", "done"].reshape(-1).tolist() == ended
    for i, a in enumerate(cases):
        stepped = [float(i), float(a), 1.0]
        assert out["next", "observation"][i].tolist() == stepped
        # an ended episode starts again from the reset observation; the others carry the step's
        assert nxt["observation"][i].tolist() == ([float(i), -1.0, 0.0] if ended[i] else stepped)
        assert nxt["done"][i].item() is False

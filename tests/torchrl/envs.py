"""Small TorchRL envs for the pool-member tests (importable: the process and ray executors
pickle their factories by reference). Import it only once torchrl is known to be installed
(``support.import_torchrl()``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase, tensorclass

# torchrl is imported by name: the main venv, where the type checker runs, does not have it.
_data: Any = importlib.import_module("torchrl.data")
Categorical, Composite = _data.Categorical, _data.Composite
NonTensor, Unbounded = _data.NonTensor, _data.Unbounded
EnvBase: Any = importlib.import_module("torchrl.envs").EnvBase

LENGTHS = (2, 3, 5)  # each sub-env's episode length, so that they end at different steps


class CountdownEnv(EnvBase):
    """A TorchRL env of batch size ``[3]`` whose sub-env ``i`` ends after ``LENGTHS[i]`` steps
    (plus a seeded 0-1 extra): observation ``[counter, noise]``, reward ``counter * action``."""

    def __init__(self) -> None:
        super().__init__(batch_size=torch.Size([3]))
        self.observation_spec = Composite(observation=Unbounded((3, 2)), shape=(3,))
        self.action_spec = Categorical(3, shape=(3,))
        self.reward_spec = Unbounded((3, 1))
        self._counter = torch.zeros(3)
        self._length = torch.tensor(LENGTHS, dtype=torch.float32)
        self._rng = torch.Generator().manual_seed(0)

    def _set_seed(self, seed: int | None) -> None:
        self._rng = torch.Generator().manual_seed(int(seed or 0))

    def _observation(self) -> torch.Tensor:
        noise = torch.rand(3, generator=self._rng)
        return torch.stack([self._counter.clone(), noise], -1)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: object) -> TensorDictBase:
        mask = torch.ones(3, dtype=torch.bool)
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict["_reset"].reshape(3)
        self._counter[mask] = 0
        extra = torch.randint(0, 2, (3,), generator=self._rng).float()
        self._length[mask] = (torch.tensor(LENGTHS, dtype=torch.float32) + extra)[mask]
        done = torch.zeros(3, 1, dtype=torch.bool)
        return TensorDict(
            {"observation": self._observation(), "done": done, "terminated": done.clone()}, self.batch_size
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict["action"].float()
        self._counter += 1
        done = (self._counter >= self._length).unsqueeze(-1)
        return TensorDict(
            {
                "observation": self._observation(),
                "reward": (self._counter * action).unsqueeze(-1),
                "done": done,
                "terminated": done.clone(),
            },
            self.batch_size,
        )


class TextEnv(EnvBase):
    """A TorchRL env of batch size ``[]`` speaking text: a ``NonTensor`` observation ``"text"``
    (what was said so far) and a ``NonTensor`` action; reward the action's length, the episode
    ends after three steps."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(
            text=NonTensor(shape=(), example_data="hello"), count=Unbounded((1,))
        )
        self.action_spec = NonTensor(shape=(), example_data="look")
        self.reward_spec = Unbounded((1,))
        self._said = ""
        self._count = 0
        self._seed = 0

    def _set_seed(self, seed: int | None) -> None:
        self._seed = int(seed or 0)

    def _td(self, **entries: torch.Tensor) -> TensorDictBase:
        td = TensorDict({"count": torch.tensor([float(self._count)]), **entries}, [])
        td.set_non_tensor("text", self._said)
        return td

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: object) -> TensorDictBase:
        self._said, self._count = f"seed {self._seed}:", 0
        done = torch.zeros(1, dtype=torch.bool)
        return self._td(done=done, terminated=done.clone())

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get_non_tensor("action")
        if not isinstance(action, str):
            raise TypeError(f"a text action, got {type(action).__name__}")
        self._said = f"{self._said} {action}"
        self._count += 1
        done = torch.tensor([self._count >= 3])
        return self._td(reward=torch.tensor([float(len(action))]), done=done, terminated=done.clone())


@tensorclass
class Position:
    """A tensorclass observation / action: two coordinates."""

    x: torch.Tensor
    y: torch.Tensor

    if TYPE_CHECKING:  # what ``@tensorclass`` adds, which type checkers do not see

        def __init__(self, *, x: torch.Tensor, y: torch.Tensor, batch_size: Sequence[int]) -> None: ...

        def clone(self) -> Position: ...

        @classmethod
        def from_tensordict(cls, tensordict: TensorDictBase) -> Position: ...


class TensorclassEnv(EnvBase):
    """A TorchRL env whose observation and action are tensorclasses (``Position``): the agent
    moves by its action; reward minus the distance to the origin; ends after four steps."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(
            position=Composite(x=Unbounded((1,)), y=Unbounded((1,)), data_cls=Position)
        )
        self.action_spec = Composite(move=Composite(x=Unbounded((1,)), y=Unbounded((1,)), data_cls=Position))
        self.reward_spec = Unbounded((1,))
        self._pos = Position(x=torch.zeros(1), y=torch.zeros(1), batch_size=[])
        self._t = 0

    def _set_seed(self, seed: int | None) -> None:
        pass

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: object) -> TensorDictBase:
        self._pos, self._t = Position(x=torch.ones(1), y=torch.ones(1), batch_size=[]), 0
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"position": self._pos.clone(), "done": done, "terminated": done.clone()}, [])

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        move = tensordict["move"]
        if not isinstance(move, Position):
            raise TypeError(f"a Position action, got {type(move).__name__}")
        self._pos = Position(x=self._pos.x + move.x, y=self._pos.y + move.y, batch_size=[])
        self._t += 1
        done = torch.tensor([self._t >= 4])
        reward = -(self._pos.x**2 + self._pos.y**2).sqrt()
        return TensorDict(
            {"position": self._pos.clone(), "reward": reward, "done": done, "terminated": done.clone()}, []
        )

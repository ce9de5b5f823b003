"""TorchRL's data-layout helpers."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

__all__ = ["TIMED_OUT", "step_mdp"]

# with on_timeout="truncate", every step result carries ("next", TIMED_OUT): bool, shape [1],
# True where a step_timeout or episode_timeout ended the episode (truncated, not terminated)
TIMED_OUT = "timed_out"


def step_mdp(td: TensorDictBase, *, keep_reward: bool = False) -> TensorDictBase:
    """Move ``"next"`` to the root: the input of the following step.

    Keeps ``"env_index"`` and drops ``"reward"`` (unless ``keep_reward``) as TorchRL does.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from aenvs import step_mdp
        >>> td = TensorDict({"action": torch.zeros(2), "next": {"observation": torch.ones(2), "reward": torch.ones(2)}}, [2])
        >>> sorted(step_mdp(td).keys())
        ['observation']
    """
    root: Any = td  # TensorDictBase.keys is partially annotated
    nxt: Any = root.get("next").copy()
    if not keep_reward and "reward" in nxt.keys():
        nxt = nxt.exclude("reward")
    if "env_index" in root.keys() and "env_index" not in nxt.keys():
        nxt.set("env_index", root.get("env_index"))
    return nxt

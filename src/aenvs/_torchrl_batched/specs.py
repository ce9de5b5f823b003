"""The batched specs of TorchRL members, built in the parent from meta envs as TorchRL does.

One member's ``full_*_spec`` are expanded to ``[num_workers, *member.batch_size]``; with
several factories, ``torch.stack`` of the members' specs (lazily stacked where they differ).

Example:
    >>> from torchrl.envs import GymEnv
    >>> specs = member_specs([lambda: GymEnv("CartPole-v1")] * 3, [{}] * 3, single=True)
    >>> specs.batch_size, specs.specs["full_observation_spec"].shape
    (torch.Size([3]), torch.Size([3]))
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from aenvs._adapters.torchrl import EnvBase

_creator: Any = importlib.import_module("torchrl.envs.env_creator")
_EnvCreator: Any = _creator.EnvCreator
_EnvMetaData: Any = _creator.EnvMetaData
_get_env_metadata: Any = _creator.get_env_metadata

__all__ = ["SPEC_NAMES", "MemberSpecs", "member_specs"]

SPEC_NAMES = (
    "full_observation_spec",
    "full_action_spec",
    "full_reward_spec",
    "full_done_spec",
    "full_state_spec",
)


@dataclass
class MemberSpecs:
    """The batched env's batch size, its five ``full_*_spec`` and the members' device."""

    batch_size: torch.Size
    specs: dict[str, Any]
    device: torch.device | None
    member_class: type | None = None


def member_specs(fns: list[Any], kwargs: list[dict[str, Any]], single: bool) -> MemberSpecs | None:
    """Make the members in the parent (one when ``single``), read their metadata as TorchRL
    does (``EnvMetaData``), close them.

    ``None`` when the members are not TorchRL envs (gymnasium ids or envs): their specs then
    come from their spaces.
    """
    if any(isinstance(fn, str) for fn in fns):
        return None
    metas: list[Any] = []
    member_class: type | None = None
    for fn, kw in zip(fns[:1] if single else fns, kwargs[:1] if single else kwargs, strict=True):
        if isinstance(fn, _EnvCreator):
            metas.append(_get_env_metadata(fn, kw))
            continue
        env = fn(**kw)
        if not isinstance(env, EnvBase):
            close = getattr(env, "close", None)
            if close is not None:
                close()
            return None
        member_class = member_class or type(env)
        try:
            metas.append(_EnvMetaData.metadata_from_env(env).clone())
        finally:
            env.close(raise_if_closed=False)
    num = len(fns)
    first = metas[0]
    batch = torch.Size([num, *first.batch_size])
    inputs: Any
    outputs: Any
    if single:
        meta = first.expand(*batch)
        inputs, outputs = meta.specs["input_spec"], meta.specs["output_spec"]
    else:
        inputs = torch.stack([m.specs["input_spec"] for m in metas], 0)
        outputs = torch.stack([m.specs["output_spec"] for m in metas], 0)
    devices = {m.device for m in metas}
    if len(devices) > 1:
        raise ValueError(
            "The device wasn't passed, but more than one device was found in the sub-environments. "
            "Please indicate a device to be used for collection."
        )
    specs: dict[str, Any] = {name: (inputs if name in _INPUTS else outputs)[name] for name in SPEC_NAMES}
    return MemberSpecs(batch, specs, first.device, member_class)


_INPUTS = ("full_action_spec", "full_state_spec")

"""TorchRL ``GymEnv`` members run through the gymnasium env inside them.

A ``torchrl.envs.GymEnv`` (or ``GymWrapper``) that adds nothing to its gymnasium env (no
pixels, frame skip of its own, info readers, batch, transforms) computes each step as the
gymnasium env does and lays the result out as the pool does for gymnasium envs: the same
keys, shapes and values. Stepping the gymnasium env directly skips the TensorDict that
TorchRL builds per env and per step, which costs more than a fast env's step itself. What
the member is asked by name (attributes, methods, seeding) still goes to the TorchRL env.

Example:
    >>> from torchrl.envs import GymEnv
    >>> member = GymEnv("CartPole-v1")
    >>> plain_gym_env(member) is member._env
    True
    >>> member.close()
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym

from aenvs._adapters.gym import GymAdapter

__all__ = ["GymEnvAdapter", "plain_gym_env"]

_ROOT_FLAGS = {"done", "terminated", "truncated"}


def plain_gym_env(env: Any) -> gym.Env[Any, Any] | None:
    """The gymnasium env inside ``env`` if ``env`` is a TorchRL ``GymEnv`` / ``GymWrapper``
    whose steps are exactly its gymnasium env's, else ``None``."""
    module, name = type(env).__module__, type(env).__name__  # pyright: ignore[reportUnknownArgumentType]
    if module != "torchrl.envs.libs.gym" or name not in ("GymEnv", "GymWrapper"):
        return None  # a subclass or a TransformedEnv may change any step
    inner = env.__dict__.get("_env")
    if not isinstance(inner, gym.Env) or isinstance(inner, gym.vector.VectorEnv):
        return None
    try:
        plain = (
            tuple(env.batch_size) == ()
            and getattr(env, "wrapper_frame_skip", 1) == 1
            and not env.info_dict_reader
            and not getattr(env, "from_pixels", False)
            and getattr(env, "_convert_actions_to_numpy", True)
            and (env.device is None or env.device.type == "cpu")
            and _keys(env.full_observation_spec) == [("observation",)]
            and _keys(env.full_action_spec) == [("action",)]
            and _keys(env.full_reward_spec) == [("reward",)]
            and {key[0] for key in _keys(env.full_done_spec)} == _ROOT_FLAGS
            and not _keys(env.full_state_spec)
        )
    except (AttributeError, KeyError):  # an attribute this TorchRL version does not have
        return None
    gym_env = cast("gym.Env[Any, Any]", inner)
    observation: Any = gym_env.observation_space
    action: Any = gym_env.action_space
    if not plain or not isinstance(observation, gym.spaces.Box):
        return None
    if isinstance(action, gym.spaces.Discrete):
        return gym_env if int(cast(Any, action).start) == 0 else None
    return gym_env if isinstance(action, gym.spaces.Box) else None


def _keys(spec: Any) -> list[tuple[str, ...]]:
    return [(key,) if isinstance(key, str) else tuple(key) for key in spec.keys(True, True)]


class GymEnvAdapter(GymAdapter):
    """A plain TorchRL ``GymEnv`` (see :func:`plain_gym_env`) stepped through its gymnasium env.

    Seeding, attributes and method calls go to the TorchRL env, as they would through
    :class:`~aenvs._adapters.torchrl.TorchRLAdapter`; closing closes it.

    Args:
        member: the TorchRL env.
        inner: its gymnasium env (``plain_gym_env(member)``).
    """

    def __init__(self, member: Any, inner: gym.Env[Any, Any]) -> None:
        super().__init__(inner)
        self.member: Any = member

    def seed(self, seed: int | None) -> None:
        """Seed as TorchRL's ``GymEnv.set_seed`` does (a reset with the seed)."""
        self.member.set_seed(seed)

    def get_attr(self, name: str) -> Any:
        return getattr(self.member, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.member, name, value)

    def close(self) -> None:
        self.member.close(raise_if_closed=False)

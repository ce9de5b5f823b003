"""The spaces of an :class:`aenvs.gymnasium.AsyncVectorEnv`: batched as gymnasium batches
them (``observation_mode``), checked as gymnasium checks them, and walked part by part."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from gymnasium import spaces
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector.utils import batch_space

from aenvs._specs import EnvSpec

__all__ = [
    "FIXED_SPACES",
    "is_array_space",
    "ObservationMode",
    "VectorSpaces",
    "dict_parts",
    "tuple_parts",
    "vector_spaces",
]

ObservationMode = str | tuple[spaces.Space[Any], spaces.Space[Any]]
"""``"same"``, ``"different"`` or ``(observation_space, single_observation_space)``, as gymnasium's."""

FIXED_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
"""The spaces batched into arrays; the others (``Text``, ``Sequence``, ``Graph``, ``OneOf``,
custom spaces) into a tuple of each env's value, as gymnasium batches them."""


def is_array_space(space: spaces.Space[Any]) -> bool:
    """Whether gymnasium batches ``space`` into one array (Box, Discrete, MultiDiscrete,
    MultiBinary), rather than a tuple of each env's value (or a Dict / Tuple of parts).

    Example:
        >>> is_array_space(spaces.Box(0, 1)), is_array_space(spaces.Text(4))
        (True, False)
    """
    return isinstance(space, FIXED_SPACES)


def dict_parts(space: spaces.Space[Any]) -> list[tuple[str, spaces.Space[Any]]] | None:
    """The ``(key, space)`` parts of a Dict space, in order; None for another space.

    Example:
        >>> dict_parts(spaces.Dict({"a": spaces.Discrete(2)}))
        [('a', Discrete(2))]
    """
    if not isinstance(space, spaces.Dict):
        return None
    return [(key, space[key]) for key in space]


def tuple_parts(space: spaces.Space[Any]) -> list[spaces.Space[Any]] | None:
    """The spaces of a Tuple space, in order; None for another space.

    Example:
        >>> tuple_parts(spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))))
        [Discrete(2), Discrete(3)]
    """
    if not isinstance(space, spaces.Tuple):
        return None
    parts = cast("spaces.Tuple[Any]", space)  # isinstance loses the type of its parts
    return [parts[i] for i in range(len(parts))]


class VectorSpaces(NamedTuple):
    """A vector env's spaces: each env's and the batch's."""

    single_observation_space: spaces.Space[Any]
    observation_space: spaces.Space[Any]
    single_action_space: spaces.Space[Any]
    action_space: spaces.Space[Any]


def vector_spaces(specs: Sequence[EnvSpec], mode: ObservationMode, name: str) -> VectorSpaces:
    """The spaces of a vector env of the envs of ``specs``, batched as ``mode`` says.

    Raises gymnasium's errors, with its messages (code matches on them) followed by which
    env and spaces differ; ``name``: the vector env's class name, for the messages.

    Example:
        >>> spec = EnvSpec.from_spaces(spaces.Box(0, 1, (3,)), spaces.Discrete(2))
        >>> vector_spaces([spec, spec], "same", "AsyncVectorEnv").observation_space
        Box(0.0, 1.0, (2, 3), float32)
    """
    n = len(specs)
    single_action_space = specs[0].action_space
    action_space = batch_space(single_action_space, n)
    if isinstance(mode, tuple) and len(mode) == 2:
        if not all(isinstance(s, spaces.Space) for s in cast("tuple[object, ...]", mode)):  # user input
            raise TypeError(f"Expected both elements of observation_mode to be Spaces, got {mode}")
        observation_space, single_observation_space = mode
    elif mode == "same":
        single_observation_space = specs[0].observation_space
        observation_space = batch_space(single_observation_space, n)
    elif mode == "different":
        # its dispatch table is typed with a bare Space
        from gymnasium.vector.utils import batch_differing_spaces  # pyright: ignore[reportUnknownVariableType]

        single_observation_space = specs[0].observation_space
        observation_space = cast(
            "spaces.Space[Any]",
            batch_differing_spaces([s.observation_space for s in specs]),
        )
    else:
        raise ValueError(
            f"Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
            f"observation space, actual got {mode}"
        )
    for i, spec in enumerate(specs):
        if mode == "same" and spec.observation_space != single_observation_space:
            raise RuntimeError(
                f"{name}(..., observation_mode='same') however some of the sub-environments observation "
                "spaces are not equivalent. If this is intentional, use `observation_mode='different'` "
                f"instead. Env {i}'s observation space is {spec.observation_space}, env 0's "
                f"{single_observation_space}."
            )
        if mode != "same" and not is_space_dtype_shape_equiv(
            spec.observation_space, single_observation_space
        ):
            raise RuntimeError(
                f"{name}(..., observation_mode='different' or custom space) however the sub-environment's "
                f"observation spaces do not share a common shape and dtype. Env {i}'s observation space "
                f"is {spec.observation_space}, the single observation space {single_observation_space}."
            )
        if spec.action_space != single_action_space:
            raise RuntimeError(
                f"Some environments have an action space different from `{single_action_space}`. "
                "In order to batch actions, the action spaces from all environments must be equal. "
                f"Env {i}'s action space is {spec.action_space}."
            )
    return VectorSpaces(single_observation_space, observation_space, single_action_space, action_space)

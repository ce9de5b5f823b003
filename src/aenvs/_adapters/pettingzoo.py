"""Telling multi-agent envs apart: PettingZoo parallel envs and RLlib-style dict envs.

Both speak dicts keyed by agent id (``reset`` gives observations and infos, ``step``
takes actions and gives observations, rewards, terminations, truncations and infos);
they differ in where the per-agent spaces are, which agents act next and how the whole
episode ends. Neither library is imported: envs are recognised by what they have, so
that ``pettingzoo`` and ``ray.rllib`` stay optional.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from aenvs._specs import Space

__all__ = ["AgentProtocol", "agent_protocol"]

Kind = Literal["pettingzoo", "dict"]


@dataclass(frozen=True)
class AgentProtocol:
    """How one multi-agent env is spoken to.

    Attributes:
        kind: ``"pettingzoo"`` (a ``pettingzoo.ParallelEnv``: its ``agents`` list says who
            acts next, the episode ends when it is empty) or ``"dict"`` (RLlib's
            ``MultiAgentEnv`` protocol: the agents given an observation and not done act
            next, ``"__all__"`` in the terminations / truncations ends the episode).
        possible_agents: every agent id the env may ever have, in its order.
        observation_space, action_space: one agent's spaces.
    """

    kind: Kind
    possible_agents: tuple[Hashable, ...]
    observation_space: Callable[[Hashable], Space]
    action_space: Callable[[Hashable], Space]

    def describe(self) -> str:
        return "PettingZoo parallel env" if self.kind == "pettingzoo" else "RLlib-style dict env"


def _method(env: Any, name: str) -> Callable[[Hashable], Space] | None:
    """``env.name`` if its class defines it as a method (not a space held in an attribute)."""
    owner = cast("type[Any]", type(env))
    if callable(getattr(owner, name, None)):
        return cast("Callable[[Hashable], Space]", getattr(env, name))
    return None


def _from_mapping(env: Any, name: str) -> Callable[[Hashable], Space] | None:
    spaces_by_agent = getattr(env, name, None)
    if isinstance(spaces_by_agent, Mapping):
        by_agent = cast("Mapping[Hashable, Space]", spaces_by_agent)
        return lambda agent: by_agent[agent]
    return None


def agent_protocol(env: Any) -> AgentProtocol | None:
    """The multi-agent protocol ``env`` speaks, or None for a single-agent env.

    A PettingZoo parallel env has ``possible_agents`` and ``observation_space(agent)`` /
    ``action_space(agent)`` methods; an RLlib-style dict env has ``get_observation_space``
    / ``get_action_space`` methods or ``observation_spaces`` / ``action_spaces`` dicts,
    and its agents in ``possible_agents`` (else the keys of ``observation_spaces``).
    PettingZoo's turn-based AEC envs are refused: their ``step`` takes one agent's action.

    Example:
        >>> from gymnasium import spaces
        >>> class Pair:
        ...     possible_agents = ["a_0", "a_1"]
        ...     observation_spaces = {a: spaces.Discrete(2) for a in possible_agents}
        ...     action_spaces = observation_spaces
        >>> protocol = agent_protocol(Pair())
        >>> protocol.kind, protocol.possible_agents, protocol.action_space("a_1")
        ('dict', ('a_0', 'a_1'), Discrete(2))
        >>> agent_protocol(object()) is None
        True
    """
    if hasattr(env, "full_observation_spec"):  # a TorchRL env (whose wrappers forward attributes)
        return None
    observation = _method(env, "observation_space")
    action = _method(env, "action_space")
    if observation is not None and action is not None and hasattr(env, "possible_agents"):
        if callable(getattr(env, "observe", None)) and callable(getattr(env, "last", None)):
            raise TypeError(
                f"{type(env).__name__} is a PettingZoo AEC (turn-based) env; aenvs runs parallel envs: "
                "convert it with pettingzoo.utils.conversions.aec_to_parallel"
            )
        return AgentProtocol("pettingzoo", _agents(env), observation, action)
    observation = _method(env, "get_observation_space") or _from_mapping(env, "observation_spaces")
    action = _method(env, "get_action_space") or _from_mapping(env, "action_spaces")
    if observation is None or action is None:
        return None
    return AgentProtocol("dict", _agents(env), observation, action)


def _agents(env: Any) -> tuple[Hashable, ...]:
    agents = tuple(cast("Any", getattr(env, "possible_agents", None) or ()))
    if not agents:
        by_agent = getattr(env, "observation_spaces", None)
        if isinstance(by_agent, Mapping):
            agents = tuple(cast("Mapping[Hashable, Any]", by_agent))
    if not agents:
        raise TypeError(
            f"{type(env).__name__} is a multi-agent env without agents: give it a `possible_agents` list "
            "(every agent id it may ever have) or `observation_spaces` keyed by agent id"
        )
    return agents

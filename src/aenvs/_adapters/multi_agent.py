"""Multi-agent envs (PettingZoo parallel envs, RLlib-style dict envs) as pool members.

Their dicts keyed by agent id are laid out as TorchRL lays out multi-agent envs: the
agents are grouped, and each group is a nested entry whose leaves carry the agent
dimension first (``docs/guide/multi-agent.md`` is the user's side of this):

- ``(group, "observation")`` ``[n_agents, ...]``: what the env observed for each agent
  at this step (an agent's last observation on the step it leaves); zeros for an agent
  the env gave no observation (not joined yet, or gone).
- ``(group, "mask")`` ``[n_agents]`` bool: the agents that act next; the policy's action
  rows of the others are never read.
- ``(group, "reward")`` ``[n_agents, 1]``: the reward each agent got at this step (0 if none).
- ``(group, "done" | "terminated" | "truncated")`` ``[n_agents, 1]``: set at the step an
  agent's episode ends and kept until the reset.
- ``(group, "action")`` ``[n_agents, ...]``: the actions, read for the masked-in agents only.

At the root, ``"reward"`` is the sum of this step's rewards over all agents, and
``"done"`` / ``"terminated"`` / ``"truncated"`` end the whole episode: ``"__all__"`` of a
dict env, or no agent left to act.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from aenvs._adapters.outcome import Outcome
from aenvs._adapters.pettingzoo import AgentProtocol, agent_protocol
from aenvs._specs import EnvSpec, Key, Space, action_reader, flatten_value, space_leaves

__all__ = ["MultiAgent", "MultiAgentAdapter", "default_groups", "multi_agent_adapter"]

ALL = "__all__"
_RESERVED = frozenset(
    {"next", "done", "terminated", "truncated", "reward", "info", "env_index", "action", "_reset", "_step"}
)
_FLAG_NAMES = ("done", "terminated", "truncated")


class MultiAgent:
    """A multi-agent env (PettingZoo parallel or RLlib-style dict env) with its agents grouped
    as you say, for a pool: return it from an env factory.

    Bare multi-agent envs are recognised without this wrapper, and grouped by default
    (agents named ``"<prefix>_<number>"`` in the group ``"<prefix>"``, any other agent
    alone); wrap one to choose its groups. The layout is in the guide's multi-agent page.

    Args:
        env: a ``pettingzoo.ParallelEnv``, or an env speaking RLlib's ``MultiAgentEnv``
            protocol (``reset() -> (obs, infos)``, ``step(actions) -> (obs, rewards,
            terminateds, truncateds, infos)``, dicts keyed by agent id, ``"__all__"`` in
            the terminations / truncations).
        groups: group name -> the ids of its agents, in the order of the agent dimension.
            Every agent of the env in exactly one group, whose agents have the same spaces.

    Example:
        >>> from gymnasium import spaces
        >>> class Duel:  # an RLlib-style dict env (reset / step left out)
        ...     possible_agents = ["red", "blue"]
        ...     observation_spaces = {a: spaces.Box(-1, 1, (2,)) for a in possible_agents}
        ...     action_spaces = {a: spaces.Discrete(3) for a in possible_agents}
        >>> env = MultiAgent(Duel(), groups={"players": ["red", "blue"]})
        >>> env.groups
        {'players': ['red', 'blue']}
    """

    def __init__(self, env: Any, groups: Mapping[str, Sequence[Hashable]] | None = None) -> None:
        self.env = env
        self.groups = None if groups is None else {str(name): list(ids) for name, ids in groups.items()}

    def __repr__(self) -> str:
        return f"MultiAgent({self.env!r}, groups={self.groups!r})"


def multi_agent_adapter(env: Any) -> MultiAgentAdapter | None:
    """The adapter of a multi-agent env (or a :class:`MultiAgent`), None for any other env."""
    if isinstance(env, MultiAgent):
        protocol = agent_protocol(env.env)
        if protocol is None:
            raise TypeError(
                f"MultiAgent wraps {type(env.env).__name__}, which is neither a PettingZoo parallel env "
                "nor an RLlib-style dict env (no per-agent spaces)"
            )
        return MultiAgentAdapter(env.env, protocol, env.groups)
    protocol = agent_protocol(env)
    return None if protocol is None else MultiAgentAdapter(env, protocol)


# -- groups and their spaces ---------------------------------------------------------------


def default_groups(
    agents: Sequence[Hashable], same: Callable[[Hashable, Hashable], bool] = lambda a, b: True
) -> dict[str, list[Hashable]]:
    """TorchRL's default grouping: agents named ``"<prefix>_<number>"`` share the group
    ``"<prefix>"`` if ``same(first, agent)`` (their spaces match); any other agent, and each
    agent of a prefix whose spaces differ, is a group of its own named after it.

    Example:
        >>> default_groups(["adversary_0", "adversary_1", "agent_0", "boss"])
        {'adversary': ['adversary_0', 'adversary_1'], 'agent': ['agent_0'], 'boss': ['boss']}
    """
    by_prefix: dict[str, list[Hashable]] = {}
    for agent in agents:
        name = str(agent)
        head, sep, tail = name.rpartition("_")
        by_prefix.setdefault(head if sep and head and tail.isdigit() else name, []).append(agent)
    groups: dict[str, list[Hashable]] = {}
    for prefix, members in by_prefix.items():
        if all(same(members[0], agent) for agent in members[1:]):
            pieces = {prefix: members}
        else:
            pieces = {str(agent): [agent] for agent in members}
        for name, ids in pieces.items():
            if name in groups:
                raise ValueError(
                    f"agents {groups[name]} and {ids} would share the group {name!r} but their spaces "
                    "differ: group them with MultiAgent(env, groups={...})"
                )
            groups[name] = ids
    return groups


def stacked_space(space: Space, n: int, who: str) -> Space:
    """The space of ``n`` agents' values of ``space`` stacked on a first (agent) dim.

    Example:
        >>> stacked_space(spaces.Discrete(3), 2, "agent")
        MultiDiscrete([3 3])
        >>> stacked_space(spaces.Box(-1, 1, (4,)), 2, "agent").shape
        (2, 4)
    """
    if isinstance(space, spaces.Box):
        box = cast("spaces.Box[Any]", space)
        shape = (n, *box.shape)
        return spaces.Box(np.broadcast_to(box.low, shape), np.broadcast_to(box.high, shape), shape, box.dtype)
    if isinstance(space, spaces.Discrete):
        return spaces.MultiDiscrete(np.full(n, int(space.n)), start=np.full(n, int(space.start)))
    if isinstance(space, spaces.MultiDiscrete):
        multi = cast("spaces.MultiDiscrete[Any]", space)
        nvec: np.ndarray = np.asarray(multi.nvec)
        start: np.ndarray = np.asarray(multi.start)
        return spaces.MultiDiscrete(
            np.broadcast_to(nvec, (n, *nvec.shape)), start=np.broadcast_to(start, (n, *start.shape))
        )
    if isinstance(space, spaces.MultiBinary):
        return spaces.MultiBinary([n, *space.shape])
    if isinstance(space, spaces.Dict):
        parts = cast("spaces.Dict[Any]", space).spaces
        return spaces.Dict({k: stacked_space(sub, n, who) for k, sub in parts.items()})
    if isinstance(space, spaces.Tuple):
        items = cast("spaces.Tuple[Any]", space).spaces
        return spaces.Tuple([stacked_space(sub, n, who) for sub in items])
    raise TypeError(
        f"{who} has the space {space}, which has no fixed shape; the agents of a group are stacked, "
        "so their spaces must be Box, Discrete, MultiDiscrete, MultiBinary, or Dict / Tuple of them"
    )


def _bools(shape: tuple[int, ...]) -> spaces.Box:
    return spaces.Box(0, 1, shape, cast("Any", np.bool_))  # numpy's stubs type Box dtypes as numbers


@dataclasses.dataclass
class _Group:
    """One group of agents: who they are and the arrays their step results go into."""

    name: str
    agents: tuple[Hashable, ...]
    observation_space: Space  # one agent's
    action_space: Space  # one agent's
    leaves: list[tuple[Key, tuple[int, ...], np.dtype]]  # one agent's observation leaves
    terminated: np.ndarray  # [n, 1] bool: kept from step to step until the reset
    truncated: np.ndarray
    read: Callable[[int], Any] = lambda index: None  # one agent's action, by its index here

    @property
    def size(self) -> int:
        return len(self.agents)


class MultiAgentAdapter:
    """Runs a multi-agent env and lays its dicts out as TorchRL's multi-agent envs do.

    See the module docstring for the layout. A multi-agent env resets as a whole: a
    reset's ``"_reset"`` option (a nested partial reset) is not passed on.
    """

    is_async = False

    def __init__(
        self, env: Any, protocol: AgentProtocol, groups: Mapping[str, Sequence[Hashable]] | None = None
    ) -> None:
        self.env = env
        self.protocol = protocol
        known = protocol.possible_agents
        obs_space, act_space = protocol.observation_space, protocol.action_space

        def same(a: Hashable, b: Hashable) -> bool:
            return obs_space(a) == obs_space(b) and act_space(a) == act_space(b)

        chosen = default_groups(known, same) if groups is None else _checked_groups(groups, known, same)
        self._groups: list[_Group] = []
        #: agent id -> (its group, its index there)
        self._where: dict[Hashable, tuple[_Group, int]] = {}
        observation: dict[str, Space] = {}
        action: dict[str, Space] = {}
        for name, ids in chosen.items():
            if name in _RESERVED:
                raise ValueError(f"{name!r} cannot name a group of agents: the layout uses it at the root")
            n, first = len(ids), ids[0]
            who = f"agent {first!r} of group {name!r}"
            group = _Group(
                name,
                tuple(ids),
                obs_space(first),
                act_space(first),
                [(leaf.key, leaf.shape, leaf.dtype) for leaf in space_leaves(obs_space(first), ())],
                np.zeros((n, 1), bool),
                np.zeros((n, 1), bool),
            )
            stacked = stacked_space(group.observation_space, n, who)
            observation[name] = spaces.Dict(
                {
                    "observation": stacked,
                    "mask": _bools((n,)),
                    "reward": spaces.Box(-np.inf, np.inf, (n, 1), np.float32),
                    **{flag: _bools((n, 1)) for flag in _FLAG_NAMES},
                }
            )
            action[name] = spaces.Dict({"action": stacked_space(group.action_space, n, who)})
            self._groups.append(group)
            for index, agent in enumerate(ids):
                self._where[agent] = (group, index)
        observation_space, action_space = spaces.Dict(observation), spaces.Dict(action)
        # TorchRL's layout: a group's actions at (group, "action"), not under the root "action"
        self.spec = EnvSpec.from_spaces(observation_space, action_space, action_root=())
        self._acting: set[Hashable] = set()  # the agents whose actions the next step passes on
        self._actions: Mapping[Key, np.ndarray] | None = None

    @property
    def groups(self) -> dict[str, list[Hashable]]:
        """Group name -> its agent ids, in the order of the agent dimension."""
        return {group.name: list(group.agents) for group in self._groups}

    # -- results -----------------------------------------------------------------------

    def _locate(self, agent: Hashable, what: str) -> tuple[_Group, int]:
        try:
            return self._where[agent]
        except (KeyError, TypeError):  # TypeError: an unhashable key
            raise ValueError(
                f"the {self.protocol.describe()} returned {what} for agent {agent!r}, which is not one "
                f"of its possible agents {list(self._where)}"
            ) from None

    def _layout(self, observations: Mapping[Hashable, Any], rewards: Mapping[Hashable, Any]) -> list[Any]:
        """The entries of every group for these per-agent dicts (the flags as they stand)."""
        arrays = {
            group.name: {sub: np.zeros((group.size, *shape), dtype) for sub, shape, dtype in group.leaves}
            for group in self._groups
        }
        for agent, value in observations.items():
            group, index = self._locate(agent, "an observation")
            mine = arrays[group.name]
            for sub, part in flatten_value(group.observation_space, value, ()):
                row = mine[sub][index]
                if np.shape(part) != row.shape:
                    raise ValueError(
                        f"the {self.protocol.describe()} observed {'.'.join(('observation', *sub))!r} "
                        f"of shape {np.shape(part)} for agent {agent!r}, but its space "
                        f"{group.observation_space} says {row.shape}"
                    )
                mine[sub][index] = part
        reward = {group.name: np.zeros((group.size, 1), np.float32) for group in self._groups}
        for agent, value in rewards.items():
            group, index = self._locate(agent, "a reward")
            reward[group.name][index, 0] = value
        items: list[Any] = []
        for group in self._groups:
            name = group.name
            items.extend(((name, "observation", *sub), value) for sub, value in arrays[name].items())
            mask = np.array([agent in self._acting for agent in group.agents], bool)
            done = group.terminated | group.truncated
            items.extend(
                [
                    ((name, "mask"), mask),
                    ((name, "reward"), reward[name]),
                    ((name, "done"), done),
                    ((name, "terminated"), group.terminated.copy()),
                    ((name, "truncated"), group.truncated.copy()),
                ]
            )
        return items

    def _infos(self, infos: Any) -> dict[str, Any] | None:
        """The non-empty per-agent infos under their agent ids (and RLlib's ``"__common__"``)."""
        if not isinstance(infos, Mapping):
            return None
        kept = {str(k): v for k, v in cast("Mapping[Any, Any]", infos).items() if v}
        return kept or None

    # -- commands ----------------------------------------------------------------------

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Outcome:
        """Reset the whole env: every agent's flags cleared, its observations laid out."""
        options = {k: v for k, v in options.items() if k != "_reset"} if options else None
        out = self.env.reset(seed=seed, options=options or None)
        try:
            observations, infos = out
        except (TypeError, ValueError):
            raise TypeError(
                f"{type(self.env).__name__}.reset returned {type(out).__name__}, not (observations, infos)"
            ) from None
        for group in self._groups:
            group.terminated[:] = False
            group.truncated[:] = False
        self._acting = self._next_agents(observations, {}, {})
        return Outcome(self._layout(observations, {}), info=self._infos(infos))

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Outcome:
        """Pass the acting agents' actions (and only theirs) to the env; lay out its results."""
        if self._actions is not actions:  # first step: readers over this env's action rows
            for group in self._groups:
                path = (group.name, "action")
                rows = {key: buffer[row] for key, buffer in actions.items() if key[:2] == path}
                group.read = action_reader(group.action_space, rows, path)
            self._actions = actions
        sent: dict[Hashable, Any] = {}
        for group in self._groups:
            for index, agent in enumerate(group.agents):
                if agent in self._acting:
                    sent[agent] = group.read(index)
        out = self.env.step(sent)
        try:
            observations, rewards, terminateds, truncateds, infos = out
        except (TypeError, ValueError):
            raise TypeError(
                f"{type(self.env).__name__}.step returned {type(out).__name__}, not (observations, rewards, "
                "terminateds, truncateds, infos)"
            ) from None
        ended = self._update_flags(terminateds, truncateds)
        self._acting = self._next_agents(observations, terminateds, truncateds)
        terminated, truncated = self._whole_episode(terminateds, truncateds, ended)
        if terminated or truncated:
            self._acting = set()
            for group in self._groups:  # the agents still in the episode end with it
                running = ~(group.terminated | group.truncated)
                group.terminated |= running & terminated
                group.truncated |= running & truncated
        reward = float(sum(float(v) for v in cast("Mapping[Hashable, Any]", rewards).values()))
        return Outcome(self._layout(observations, rewards), reward, terminated, truncated, self._infos(infos))

    def _update_flags(self, terminateds: Mapping[Hashable, Any], truncateds: Mapping[Hashable, Any]) -> bool:
        """Record the agents' flags of this step; whether an agent was truncated at it."""
        truncated_now = False
        for flags, which in ((terminateds, "terminated"), (truncateds, "truncated")):
            for agent, value in flags.items():
                if agent == ALL:
                    continue
                group, index = self._locate(agent, f"{which}={value!r}")
                getattr(group, which)[index, 0] = bool(value)
                truncated_now = truncated_now or (which == "truncated" and bool(value))
        return truncated_now

    def _next_agents(
        self,
        observations: Mapping[Hashable, Any],
        terminateds: Mapping[Hashable, Any],
        truncateds: Mapping[Hashable, Any],
    ) -> set[Hashable]:
        """The agents that act at the next step: a PettingZoo env's ``agents``; for a dict env,
        those observed now and not done."""
        if self.protocol.kind == "pettingzoo":
            acting = set(cast("Sequence[Hashable]", self.env.agents))
            for agent in acting:
                self._locate(agent, "a live agent (in env.agents)")
            return acting
        return {
            agent
            for agent in observations
            if not terminateds.get(agent, False) and not truncateds.get(agent, False)
        }

    def _whole_episode(
        self, terminateds: Mapping[Hashable, Any], truncateds: Mapping[Hashable, Any], truncated_now: bool
    ) -> tuple[bool, bool]:
        """(terminated, truncated) of the whole env: a dict env's ``"__all__"`` flags; else (a
        PettingZoo env), once no agent is left to act, truncated if an agent was truncated at
        this step, else terminated."""
        if self.protocol.kind == "dict" and (ALL in terminateds or ALL in truncateds):
            # a dict env may have no agent acting at a step and go on (a turn of nobody's)
            return bool(terminateds.get(ALL, False)), bool(truncateds.get(ALL, False))
        if self._acting:
            return False, False
        return not truncated_now, truncated_now

    def seed(self, seed: int | None) -> None:
        """Reset with ``seed`` and seed every agent's action space (``seed + its index``)."""
        self.reset(seed, None)  # through the adapter: the agents' flags and mask follow the env
        if seed is not None:
            for offset, agent in enumerate(self.protocol.possible_agents):
                self.protocol.action_space(agent).seed(seed + offset)

    def get_attr(self, name: str) -> Any:
        return getattr(self.env, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def close(self) -> Any:
        return self.env.close()


def _checked_groups(
    groups: Mapping[str, Sequence[Hashable]],
    known: Sequence[Hashable],
    same: Callable[[Hashable, Hashable], bool],
) -> dict[str, list[Hashable]]:
    """``groups`` if every agent of the env is in exactly one of them with its spaces' likes."""
    seen: dict[Hashable, str] = {}
    for name, ids in groups.items():
        if not ids:
            raise ValueError(f"group {name!r} has no agents")
        for agent in ids:
            if agent not in known:
                raise ValueError(
                    f"group {name!r} names agent {agent!r}, which the env does not have: {list(known)}"
                )
            if agent in seen:
                raise ValueError(f"agent {agent!r} is in two groups, {seen[agent]!r} and {name!r}")
            seen[agent] = name
            if not same(ids[0], agent):
                raise ValueError(
                    f"group {name!r}: agent {agent!r} has other spaces than agent {ids[0]!r}; "
                    "the agents of a group are stacked, so their spaces must be the same"
                )
    missing = [agent for agent in known if agent not in seen]
    if missing:
        raise ValueError(f"agents {missing} are in no group; every agent of the env must be in one")
    return {name: list(ids) for name, ids in groups.items()}

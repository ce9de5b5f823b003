"""What a batched env's step reads of its specs, read once per set of spec objects.

A TorchRL env's specs are objects that change by being replaced (setting a spec, a
transform's output): :class:`StepPlans` keeps the plan of the spec objects it last saw,
and reads the specs again when one of them is another object (an equal one lays out the
same: the check compares by identity first).

Example:
    >>> from torchrl.envs import GymEnv
    >>> from aenvs.torchrl import SerialEnv
    >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))  # no pool started yet
    >>> plan = StepPlans().get(env, OutputLayout())
    >>> plan.fusable, sorted(plan.rewards)
    (True, ['reward'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aenvs._specs import OBJECT
from aenvs._torchrl_batched.filling import FlatLayout, OutputLayout, key_tuple

__all__ = ["FLAGS", "OUTPUTS", "RESET_OUTPUTS", "StepPlan", "StepPlans", "columns_fit"]

FLAGS = ("done", "terminated", "truncated")
OUTPUTS = ("full_observation_spec", "full_reward_spec", "full_done_spec")
RESET_OUTPUTS = ("full_observation_spec", "full_done_spec")


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What a step reads of the specs.

    Attributes:
        fusable: one batch dim and plain flags: a step can reset its ended episodes itself.
        plain: root tensor outputs (``step_layout``) and no state entries: TorchRL's step
            machinery adds nothing to the step's result.
        step_layout: the step's outputs as root tensors (None: other specs).
        reset_layout: the reset's outputs as root tensors (None: other specs).
        rewards: the root names of the rewards.
        not_carried: the root names a step's input does not carry to the next (rewards,
            flags, masks, ``"next"``).
    """

    fusable: bool
    plain: bool
    step_layout: FlatLayout | None
    reset_layout: FlatLayout | None
    rewards: frozenset[str]
    not_carried: frozenset[str]


class StepPlans:
    """The :class:`StepPlan` of an env's current spec objects."""

    def __init__(self) -> None:
        self._specs: tuple[Any, ...] | None = None
        self._plan: StepPlan | None = None

    def get(self, env: Any, layout: OutputLayout) -> StepPlan:
        """The plan of ``env``'s specs now (``layout``: its output layout, which caches the
        flat layouts)."""
        specs = _spec_objects(env)
        plan = self._plan
        if plan is not None and specs is not None and specs == self._specs:
            return plan
        plan = self._plan = _read(env, layout)
        self._specs = specs
        return plan


def _spec_objects(env: Any) -> tuple[Any, ...] | None:
    """The env's spec objects and batch size (None: specs not held as TorchRL holds them)."""
    found: list[Any] = [env.batch_size]
    for name in ("_output_spec", "_input_spec"):
        specs = getattr(env.__dict__.get(name), "_specs", None)
        if not isinstance(specs, dict):
            return None
        found.extend(specs.values())  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
    return tuple(found)


def _read(env: Any, layout: OutputLayout) -> StepPlan:
    step_layout = layout.flat_layout(env, OUTPUTS)
    rewards = frozenset(key_tuple(key)[0] for key in env.reward_keys)
    done_keys = [key_tuple(key) for key in env.done_keys]
    flags = frozenset(key[0] for key in done_keys)
    return StepPlan(
        fusable=env.batch_dims == 1 and all(len(key) == 1 and key[0] in FLAGS for key in done_keys),
        plain=step_layout is not None and not env.state_keys,
        step_layout=step_layout,
        reset_layout=layout.flat_layout(env, RESET_OUTPUTS),
        rewards=rewards,
        not_carried=rewards | flags | {"_reset", "next"},
    )


def columns_fit(plan: StepPlan, pool: Any) -> tuple[FlatLayout, FlatLayout] | None:
    """The step's and the reset's flat layouts of ``plan``, when ``pool``'s columns hold each
    of their entries as an array of that shape (a dense pool of members without a batch
    shape of their own): a step can then go through the pool's columns. Else None."""
    step, reset = plan.step_layout, plan.reset_layout
    if step is None or reset is None or not pool.is_dense:
        return None
    spec = pool.env_specs[0]
    if spec.batch_shape:
        return None
    for leaves, wanted in ((spec.step_leaves, step), (spec.reset_leaves, reset)):
        shapes = {leaf.key: (pool.num_envs, *leaf.shape) for leaf in leaves if leaf.dtype != OBJECT}
        if not all(shapes.get((key,)) == tuple(shape) for key, shape, _ in wanted):
            return None
    return step, reset

"""Env factories written every way a factory may ask for its EnvContext, or not ask.

No ``from __future__ import annotations`` here: the annotations are the objects themselves,
as most user code has them (a string annotation is :func:`annotated_in_a_string`'s).
"""

import functools
from typing import Any, Optional

import gymnasium as gym

from aenvs import EnvContext

ENV_ID = "aenvs-tests/Reporter-v0"


class Reporter(gym.Env[Any, Any]):
    """Says which env index its factory was given (``got``; None: no EnvContext)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ctx: Any = None, seed: int | None = None) -> None:
        if ctx is not None and not isinstance(ctx, EnvContext):
            raise TypeError(f"given {ctx!r} where an EnvContext or nothing was expected")
        self.got = None if ctx is None else ctx.env_index
        self.seed_given = seed

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        return 0, 0.0, False, False, {}


gym.register(ENV_ID, entry_point=f"{__name__}:Reporter")


def named_ctx(ctx=None):  # as a user writes it
    return Reporter(ctx)


def named_context(context=None):
    return Reporter(context)


def annotated(c: EnvContext | None = None) -> Reporter:
    return Reporter(c)


def annotated_optional(c: Optional[EnvContext] = None) -> Reporter:  # noqa: UP045 - the old spelling
    return Reporter(c)


def annotated_in_a_string(c: "EnvContext | None" = None) -> Reporter:  # PEP 563 style
    return Reporter(c)


def keyword_only(*, ctx: Any) -> Reporter:
    return Reporter(ctx)


def one_required(c):
    return Reporter(c)


def other_optional(seed=7):  # a default of its own: not a context
    return Reporter(seed=seed)


def no_parameter() -> Reporter:
    return Reporter()


# what a factory gets: its env index (an EnvContext) or None (called with no argument)
FACTORIES: dict[str, tuple[Any, bool]] = {
    "named_ctx": (named_ctx, True),
    "named_context": (named_context, True),
    "annotated": (annotated, True),
    "annotated_optional": (annotated_optional, True),
    "annotated_in_a_string": (annotated_in_a_string, True),
    "keyword_only": (keyword_only, True),
    "one_required": (one_required, True),
    "a_class": (Reporter, True),  # its __init__ has a parameter named ctx
    "other_optional": (other_optional, False),
    "no_parameter": (no_parameter, False),
    # gymnasium.make takes optional arguments (max_episode_steps...) and **kwargs: never a context
    "gym_make": (functools.partial(gym.make, f"{__name__}:{ENV_ID}"), False),
    "gym_make_keywords": (functools.partial(gym.make, f"{__name__}:{ENV_ID}", max_episode_steps=5), False),
}

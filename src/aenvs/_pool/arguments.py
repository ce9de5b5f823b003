"""The pool's construction arguments, read and checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from aenvs._env import EnvFn
from aenvs._errors import EnvError
from aenvs._pool.deadlines import OnTimeout, check_on_timeout
from aenvs._rate_limit import RateLimit
from aenvs._specs import EnvSpec
from aenvs.executors import Executor, make_executor

__all__ = [
    "PoolOptions",
    "StackMode",
    "check_batch_shapes",
    "check_choices",
    "check_limits",
    "check_not_negative",
    "env_fns_list",
    "is_dense",
    "make_kwargs_by_env",
]

StackMode = Literal["dense", "lazy", "auto"]


@dataclass(frozen=True, kw_only=True)
class PoolOptions:
    """The options of :class:`~aenvs.AsyncEnvPool` that its parts run by (its ``Args`` say what
    each means), checked when built: ValueError / TypeError naming the bad one.

    Example:
        >>> PoolOptions(episode_timeout=2.0, on_timeout="truncate").truncate
        True
        >>> PoolOptions(step_timeout=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: step_timeout must be >= 0, got -1.0
    """

    on_error: Literal["raise", "restart"] = "raise"
    max_restarts: int = 3
    restart_backoff: float = 0.1
    step_timeout: float | None = None
    reset_timeout: float | None = None
    startup_timeout: float | None = None
    close_timeout: float | None = None
    check_finite: bool = False
    episode_timeout: float | None = None
    on_timeout: OnTimeout = "raise"
    max_concurrency: int | None = None
    rate_limit: RateLimit | None = None
    copy_results: bool = True

    def __post_init__(self) -> None:
        check_limits(self.max_concurrency, self.rate_limit)
        check_not_negative(
            max_restarts=self.max_restarts,
            restart_backoff=self.restart_backoff,
            step_timeout=self.step_timeout,
            reset_timeout=self.reset_timeout,
            startup_timeout=self.startup_timeout,
            close_timeout=self.close_timeout,
            episode_timeout=self.episode_timeout,
        )
        check_on_timeout(self.on_timeout)

    @property
    def truncate(self) -> bool:
        """Whether timeouts end episodes as truncated (and step results carry ``"timed_out"``)."""
        return self.on_timeout == "truncate"

    def executor(
        self, executor: str | Executor, *, envs_per_worker: int | None, num_workers: int | None
    ) -> Executor:
        """The executor ``executor`` names (or is), with these options' timeouts."""
        return executor_for(
            executor,
            envs_per_worker=envs_per_worker,
            num_workers=num_workers,
            startup_timeout=self.startup_timeout,
            close_timeout=self.close_timeout,
            step_timeout=self.step_timeout,
            reset_timeout=self.reset_timeout,
        )


def env_fns_list(env_fns: EnvFn | Sequence[EnvFn], num_envs: int | None) -> list[EnvFn]:
    """One factory per env: ``env_fns`` itself, or ``num_envs`` times a single factory (or id).

    Example:
        >>> env_fns_list("CartPole-v1", 2)
        ['CartPole-v1', 'CartPole-v1']
        >>> env_fns_list(["CartPole-v1"], 2)
        Traceback (most recent call last):
        ...
        ValueError: num_envs=2 but 1 env_fns were given
    """
    if isinstance(env_fns, str) or callable(env_fns):
        if num_envs is None:
            num_envs = 1
        fns: list[EnvFn] = [env_fns] * num_envs
    else:
        fns = list(env_fns)
        if num_envs is not None and num_envs != len(fns):
            raise ValueError(f"num_envs={num_envs} but {len(fns)} env_fns were given")
    if not fns:
        raise ValueError("a pool needs at least one env")
    return fns


def check_choices(stack: str, on_error: str) -> None:
    """Refuse a ``stack`` or an ``on_error`` the pool does not know.

    Example:
        >>> check_choices("dense", "retry")
        Traceback (most recent call last):
        ...
        ValueError: on_error must be 'raise' or 'restart', got 'retry'
    """
    if stack not in ("dense", "lazy", "auto"):
        raise ValueError(f"stack must be 'dense', 'lazy' or 'auto', got {stack!r}")
    if on_error not in ("raise", "restart"):
        raise ValueError(f"on_error must be 'raise' or 'restart', got {on_error!r}")


def check_not_negative(**values: float | None) -> None:
    """Refuse a negative count or duration (None stands for none given).

    Example:
        >>> check_not_negative(max_restarts=3, step_timeout=None, close_timeout=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: close_timeout must be >= 0, got -1.0
    """
    for name, value in values.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def check_limits(max_concurrency: int | None, rate_limit: RateLimit | None) -> None:
    """Refuse a ``max_concurrency`` that is not an int >= 1, or a ``rate_limit`` that is not a
    :class:`~aenvs.RateLimit` (None stands for no limit).

    Example:
        >>> check_limits(0, None)
        Traceback (most recent call last):
        ...
        ValueError: max_concurrency must be >= 1 (or None: no limit), got 0
    """
    if max_concurrency is not None:
        given = cast(object, max_concurrency)
        if isinstance(given, bool) or not isinstance(given, int):
            raise TypeError(f"max_concurrency must be an int or None, got {type(given).__name__}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 (or None: no limit), got {max_concurrency}")
    if rate_limit is not None and not isinstance(cast(object, rate_limit), RateLimit):
        raise TypeError(
            f"rate_limit must be an aenvs.RateLimit or None, got {type(cast(object, rate_limit)).__name__}"
        )


def executor_for(
    executor: str | Executor,
    *,
    envs_per_worker: int | None,
    num_workers: int | None,
    startup_timeout: float | None,
    close_timeout: float | None,
    step_timeout: float | None,
    reset_timeout: float | None,
) -> Executor:
    """The executor ``executor`` names (or is), with the pool's timeouts; refuses command
    timeouts on an executor that cannot stop a command in flight.

    Example:
        >>> executor_for("inline", envs_per_worker=None, num_workers=None, startup_timeout=5.0,
        ...     close_timeout=None, step_timeout=None, reset_timeout=None).startup_timeout
        5.0
    """
    built = make_executor(executor, envs_per_worker=envs_per_worker, num_workers=num_workers)
    if startup_timeout is not None:
        built.startup_timeout = startup_timeout
    if close_timeout is not None:
        built.close_timeout = close_timeout
    capabilities = built.capabilities
    if (step_timeout is not None or reset_timeout is not None) and not capabilities.abort:
        raise ValueError(
            f"step_timeout / reset_timeout need an executor that can stop a command in flight; "
            f"the {built.name} executor cannot (its capabilities: {capabilities})"
        )
    return built


def make_kwargs_by_env(
    make_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, num_envs: int
) -> dict[int, Mapping[str, Any]]:
    """Env index -> keyword arguments for ``gymnasium.make``: one dict for all, or one per env.

    Example:
        >>> make_kwargs_by_env({"max_episode_steps": 5}, 2)
        {0: {'max_episode_steps': 5}, 1: {'max_episode_steps': 5}}
    """
    if make_kwargs is None or isinstance(make_kwargs, Mapping):
        return {i: make_kwargs or {} for i in range(num_envs)}
    if len(make_kwargs) != num_envs:
        raise ValueError(f"make_kwargs has {len(make_kwargs)} entries for {num_envs} envs")
    return dict(enumerate(make_kwargs))


def check_batch_shapes(specs: Sequence[EnvSpec]) -> None:
    """Refuse members whose own batch shapes differ (a TorchRL env of batch size ``[3]`` beside
    one of ``[]`` or ``[2]``): the pool's batch is ``[num_envs, *batch_shape]``, one shape for all.

    Example:
        >>> from gymnasium import spaces
        >>> box, two = spaces.Box(-1, 1, (2,)), spaces.Discrete(2)
        >>> check_batch_shapes([EnvSpec.from_spaces(box, two, batch_shape=(3,)), EnvSpec.from_spaces(box, two)])
        Traceback (most recent call last):
        ...
        aenvs._errors.EnvError: env 1 has batch size [] but env 0 has batch size [3]: ...
    """
    for i, spec in enumerate(specs[1:], start=1):
        if spec.batch_shape != specs[0].batch_shape:
            message = (
                f"env {i} has batch size {list(spec.batch_shape)} but env 0 has batch size "
                f"{list(specs[0].batch_shape)}: every env of a pool must have the same one (the "
                "pool's batch is [num_envs, *batch size]); use one pool per batch size"
            )
            raise EnvError(i, "make", exc_type="ValueError", message=message)


def is_dense(stack: StackMode, specs: Sequence[EnvSpec]) -> bool:
    """Whether batches of envs with ``specs`` are dense: ``stack="auto"`` when they all share
    keys and shapes; ``"dense"`` refuses envs that do not (ValueError).

    Example:
        >>> is_dense("lazy", [])
        False
    """
    if stack == "lazy":
        return False
    for i, spec in enumerate(specs[1:], start=1):
        difference = specs[0].layout_difference(spec)
        if difference is not None:
            if stack == "dense":
                raise ValueError(
                    f"stack='dense' needs every env to share keys and shapes, but env {i} differs "
                    f"from env 0: {difference}; use stack='lazy' or 'auto'"
                )
            return False
    return True

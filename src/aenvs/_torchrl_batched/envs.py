"""``SerialEnv`` / ``ParallelEnv``: TorchRL ``EnvBase`` subclasses with TorchRL's constructor,
run by an aenvs pool (any executor: ``executor=``).

Example:
    >>> from torchrl.envs import GymEnv
    >>> from aenvs.torchrl import SerialEnv
    >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))  # as torchrl.envs.SerialEnv
    >>> env.rollout(5, break_when_any_done=False).batch_size
    torch.Size([2, 5])
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
from tensordict import TensorDict, TensorDictBase

import aenvs._sync as _sync
from aenvs._adapters.torchrl import EnvBase, MultiOneHot, OneHot
from aenvs._tensors import flat_entries, from_numpy, td_get, td_keys, td_unchecked
from aenvs._torchrl_batched.filling import FlatLayout, OutputLayout, key_tuple, tensors_of
from aenvs._torchrl_batched.options import IGNORED, check_torchrl_options, factories
from aenvs._torchrl_batched.plans import FLAGS, OUTPUTS, RESET_OUTPUTS, StepPlan, StepPlans, columns_fit
from aenvs._torchrl_batched.specs import SPEC_NAMES, MemberSpecs, member_specs
from aenvs._torchrl_batched.views import BatchedViews
from aenvs._torchrl_batched.wrapper import AenvsWrapper

__all__ = ["ParallelEnv", "SerialEnv"]

_DONE = ("done",)


class _BatchedEnv(BatchedViews, EnvBase):
    """TorchRL's batched env on an aenvs pool: see :class:`SerialEnv`."""

    _shim_class: ClassVar[type[_sync.BatchedEnv]]
    _parallel: ClassVar[bool]

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Any,
        *,
        create_env_kwargs: Any = None,
        device: Any = None,
        executor: Any = None,
        **options: Any,
    ) -> None:
        torchrl_options = {key: options.pop(key) for key in list(options) if key in IGNORED}
        check_torchrl_options(type(self).__name__, torchrl_options, self._parallel)
        fns, kwargs = factories(num_workers, create_env_fn, create_env_kwargs)
        single = callable(create_env_fn) or isinstance(create_env_fn, str) or len(set(map(id, fns))) == 1
        if single and create_env_kwargs is not None and not isinstance(create_env_kwargs, dict):
            single = all(k == kwargs[0] for k in kwargs)
        meta = member_specs(fns, kwargs, single)
        self._fns, self._kwargs, self._executor, self._pool_options = fns, kwargs, executor, options
        self._shim: _sync.BatchedEnv | None = None
        self._wrapper: Any = None
        self._meta: MemberSpecs | None = meta
        if meta is None:  # gymnasium members: the specs of their spaces (AenvsWrapper's)
            self._start()
            batch = self._wrapper.batch_size
        else:
            batch = meta.batch_size
            device = meta.device if device is None else device  # TorchRL takes the members' device
        EnvBase.__init__(self, device=device, batch_size=batch)
        self.num_workers = num_workers
        self.create_env_fn, self.create_env_kwargs = fns, kwargs
        specs = (
            meta.specs
            if meta is not None
            else {name: getattr(self._wrapper, name).clone() for name in SPEC_NAMES}
        )
        for name in SPEC_NAMES:
            setattr(self, name, specs[name].to(self.device) if self.device is not None else specs[name])
        self._action_keys = [key_tuple(k) for k in self.full_action_spec.keys(True, True)]
        self._dispatch = True

    def __getattr__(self, attr: str) -> Any:
        try:
            return EnvBase.__getattr__(self, attr)
        except AttributeError:
            if attr.startswith("_") or not self.__dict__.get("_dispatch"):
                raise
        return self.forward_attr(attr)  # the members' attribute, as TorchRL forwards it

    # -- the pool ---------------------------------------------------------------------------

    def _start(self) -> None:
        fns = [fn if not kw else _bind(fn, kw) for fn, kw in zip(self._fns, self._kwargs, strict=True)]
        if any(isinstance(fn, str) for fn in fns):
            self._shim = self._shim_class(
                len(fns), self._fns, self._kwargs, executor=self._executor, **self._pool_options
            )
        else:
            self._shim = self._shim_class(len(fns), fns, executor=self._executor, **self._pool_options)
        self._was_reset = False
        if self._meta is None:
            # through __dict__: an nn.Module cannot be assigned before Module.__init__, which
            # needs the batch size this wrapper gives
            self.__dict__["_wrapper"] = AenvsWrapper(self._shim)

    @property
    def is_closed(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        # the pool decides (TorchRL's EnvBase sets it); a view has its own flag
        return self.__dict__.get("_shim") is None or self.__dict__.get("_view_closed", False)

    @is_closed.setter
    def is_closed(self, value: bool) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self.is_view:
            self.__dict__["_view_closed"] = value

    def _run(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run a pool coroutine function to its end (on the sync shim's loop)."""
        return self._running().loop_driver.run(fn, *args, **kwargs)

    def _running(self) -> _sync.BatchedEnv:
        if self._shim is None:  # first call, or after close(): (re)start, as TorchRL does
            self._start()
        assert self._shim is not None
        return self._shim

    # -- EnvBase ----------------------------------------------------------------------------

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        # TorchRL's own, with one pool call for both halves: the step resets the envs whose
        # episode ended (the pool's step_and_maybe_reset) and the reset that TorchRL's
        # maybe_reset asks for next is answered from those rows
        keys = list(td_keys(tensordict))
        plan = self._step_plan()
        fuse = plan.fusable and self.worker_indices is None and "_step" not in keys
        self.__dict__["_fuse_reset"] = fuse
        try:
            if fuse and self._lean(tensordict, keys, plan):
                return self._lean_step_and_maybe_reset(tensordict, plan)
            step_and_maybe_reset = cast(Any, super()._step_and_maybe_reset)  # pyright: ignore[reportUnknownMemberType]
            return step_and_maybe_reset(tensordict)
        finally:
            self.__dict__["_fuse_reset"] = False
            self.__dict__["_reset_rows"] = None

    def _lean(self, tensordict: TensorDictBase, keys: list[Any], plan: StepPlan) -> bool:
        """Whether TorchRL's step machinery would add nothing to :meth:`_step`'s result here:
        this class's own step and reset, no hooks or checks, no preset ``"next"``, specs of
        root tensors that the step fills as they are."""
        cls = type(self)
        return (
            cls._step is _BatchedEnv._step
            and cls._reset is _BatchedEnv._reset
            and cls._step_proc_data is EnvBase._step_proc_data
            and self._post_step_mdp_hooks is None
            and not self.run_type_checks
            and not self.__dict__.get("_torchrl_native_autoreset", False)
            and self.__dict__.get("_compiled_step_and_maybe_reset") is None
            and "next" not in keys
            and tensordict.batch_size == self.batch_size
            and tensordict.device == self.device
            and plan.plain
        )

    def _lean_step_and_maybe_reset(
        self, tensordict: TensorDictBase, plan: StepPlan
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """TorchRL's ``step_and_maybe_reset`` for :meth:`_lean` cases: the step's entries set
        under ``"next"``, TorchRL's ``step_mdp``, then the reset rows of the envs whose
        episode ended written over the next input."""
        root = flat_entries(tensordict)  # the input's entries, before "next" joins them
        nxt, ended, reset = self._step_and_reset_rows(tensordict, plan)
        any_ended = any(_flags(ended))
        following = self._step_mdp_flat(tensordict, root, nxt, ended if any_ended else None, reset, plan)
        if root is not None:  # a TensorDict of tensors: "next" set as TorchRL's step_mdp sets entries
            cast(Any, tensordict)._set_str("next", nxt, validated=True, inplace=False, non_blocking=False)
        else:
            tensordict.set("next", nxt)
        if following is None:
            following = self._step_mdp(tensordict)
            if any_ended:
                # as TorchRL's maybe_reset: the reset rows over the others; unless every env
                # was reset, entries the reset does not give (the action...) are zeros there
                if all(_flags(ended)):
                    following.update(reset())  # pyright: ignore[reportUnknownMemberType]
                else:
                    following.where(~ended, other=reset(), out=following, pad=0, update_batch_size=True)
        return tensordict, following

    def _step_and_reset_rows(
        self, tensordict: TensorDictBase, plan: StepPlan | None = None
    ) -> tuple[TensorDictBase, torch.Tensor, Callable[[], TensorDictBase]]:
        """One pool call for a step and the resets of the episodes it ends: the step's
        result laid out as the specs, which envs ended (one bool per env), and what makes
        the next input's rows for every env (reset ones where the episode ended): a step
        where no episode ended need not build them."""
        self._stepping()
        if (layouts := self._column_layouts(plan or self._step_plan())) is not None:
            return self._step_and_reset_columns(tensordict, *layouts)
        if self._wrapper is not None:
            nxt, reset = self._wrapper.step_and_reset_rows(tensordict)
        else:
            out, reset = self._run(self.pool.step_and_maybe_reset, self._actions(tensordict))
            nxt = self._fill(out["next"], OUTPUTS)
            reset = self._fill(reset, RESET_OUTPUTS)
        nxt, reset = self._on_device(nxt), self._on_device(reset)
        return nxt, self._ended(nxt), lambda: reset

    def _step_and_reset_columns(
        self, tensordict: TensorDictBase, step_layout: FlatLayout, reset_layout: FlatLayout
    ) -> tuple[TensorDictBase, torch.Tensor, Callable[[], TensorDictBase]]:
        """:meth:`_step_and_reset_rows` through the pool's columns: no TensorDict of the pool's
        to build and lay out again, the specs' tensors straight from its arrays."""
        actions = self._action_values(tensordict)
        step, following = self._run(self.pool.step_and_maybe_reset_columns, actions)
        batch, device = self.batch_size, self.device
        cpu = device if device is not None and device.type == "cpu" else None
        nxt = self._on_device(td_unchecked(tensors_of(step, step_layout), batch, cpu))

        def reset() -> TensorDictBase:
            return self._on_device(td_unchecked(tensors_of(following, reset_layout), batch, cpu))

        return nxt, from_numpy(step[_DONE].reshape(-1)), reset

    def _column_layouts(self, plan: StepPlan) -> tuple[FlatLayout, FlatLayout] | None:
        """The step's and the reset's flat layouts, when the pool's columns hold them
        (:func:`columns_fit`), read once per plan and pool."""
        pool = self.pool
        cached = self.__dict__.get("_column_layouts_cache")
        if cached is None or cached[0] is not pool or cached[1] is not plan:
            cached = self.__dict__["_column_layouts_cache"] = (pool, plan, columns_fit(plan, pool))
        return cached[2]

    def _stepping(self) -> None:
        """Get the pool ready for a step: started, and reset if it was not (TorchRL's
        members step without a reset; a pool's envs do not)."""
        self.check_view()
        shim = self._running()
        if not self._was_reset:
            shim.reset()
            self._was_reset = True

    def _step_plan(self) -> StepPlan:
        """What a step reads of the specs, read once per set of spec objects."""
        plans: StepPlans | None = self.__dict__.get("_step_plans")
        if plans is None:
            plans = self.__dict__["_step_plans"] = StepPlans()
        return plans.get(self, self._layout())

    def _reset_from_step(
        self, tensordict: TensorDictBase | None, kwargs: dict[str, Any]
    ) -> TensorDictBase | None:
        """The reset rows the fused step kept, if this reset asks for exactly those envs."""
        kept: tuple[torch.Tensor, Callable[[], TensorDictBase]] | None = self.__dict__.get("_reset_rows")
        self.__dict__["_reset_rows"] = None
        if kept is None or kwargs or tensordict is None:
            return None
        ended, rows = kept
        mask = _reset_mask(tensordict, self.batch_size[:1])
        return rows() if mask is not None and torch.equal(mask, ended) else None

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        self.check_view()
        reused = self._reset_from_step(tensordict, kwargs)
        if reused is not None:
            return reused
        shim = self._running()
        self._was_reset = True
        if self._wrapper is not None:
            return self._on_device(self._wrapper._reset(tensordict, **kwargs))  # pyright: ignore[reportPrivateUsage]
        inputs = None
        if tensordict is not None:
            mask = _reset_mask(tensordict, self.batch_size[:1])
            if mask is not None:
                inputs = tensordict.select(*self._kept_keys(), strict=False)
                inputs = _flat(inputs, self.batch_size[:1]).set("_reset", mask.reshape(-1, 1))
        out = shim.reset(inputs, env_index=self.worker_indices, **kwargs)
        self._was_reset = True
        return self._on_device(self._fill(out, ("full_observation_spec", "full_done_spec")))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.__dict__.get("_fuse_reset", False):
            nxt, ended, reset = self._step_and_reset_rows(tensordict)
            self.__dict__["_reset_rows"] = (ended, reset)  # for the reset TorchRL asks next
            return nxt
        self._stepping()
        if self._wrapper is not None:
            return self._on_device(self._wrapper._step(tensordict))  # pyright: ignore[reportPrivateUsage]
        n = self.batch_size[:1]
        actions = self._actions(tensordict)
        if "_step" in td_keys(tensordict):
            kept = _flat(tensordict.select(*self._kept_keys(), strict=False), n)
            step: torch.Tensor = td_get(tensordict, "_step")
            for key in td_keys(kept, nested=True, leaves=True):
                actions.set(key, td_get(kept, key))
            actions.set("_step", step.reshape(-1))
        out = self._run(self.pool.step, actions, self.worker_indices)
        return self._on_device(self._fill(out["next"], OUTPUTS))

    def _actions(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The actions of ``tensordict`` as the pool takes them (:meth:`_action_values`), in a
        TensorDict."""
        values = self._action_values(tensordict)
        n = self.batch_size[:1]
        if all(type(k) is str for k in values) and all(v.shape[:1] == n for v in values.values()):
            return td_unchecked(cast(dict[str, Any], values), n)
        actions = TensorDict({}, batch_size=n)
        for key, value in values.items():
            actions.set(key, value)
        return actions

    def _action_values(self, tensordict: TensorDictBase) -> dict[str | tuple[str, ...], torch.Tensor]:
        """The actions of ``tensordict`` by the pool's key: cast to their spec's dtype (as
        TorchRL does), one-hot ones as indices, several under ``"action"``."""
        values: dict[str | tuple[str, ...], torch.Tensor] = {}
        for key, pool_key, spec in self._action_plan():
            value: torch.Tensor = td_get(tensordict, key)
            if isinstance(spec, OneHot):  # the adapter takes indices, as gymnasium envs
                value = (value.to(torch.uint8) if value.dtype is torch.bool else value).argmax(-1)
            elif isinstance(spec, MultiOneHot):
                value = spec.to_categorical(value.to(spec.dtype))
            elif value.dtype != spec.dtype:
                value = value.to(spec.dtype)  # TorchRL casts actions to their spec's dtype
            values[pool_key[0] if len(pool_key) == 1 else pool_key] = value
        return values

    def _action_plan(self) -> list[tuple[tuple[str, ...], tuple[str, ...], Any]]:
        """Per action leaf: its key, the pool's key for it, its spec; read once per spec."""
        spec = self.full_action_spec
        cached = self.__dict__.get("_action_plan_cache")
        if cached is not None and cached[0] is spec:
            return cached[1]
        nested = self._action_keys != [("action",)]
        plan = [(key, ("action", *key) if nested else key, spec[key]) for key in self._action_keys]
        self.__dict__["_action_plan_cache"] = (spec, plan)
        return plan

    def _on_device(self, td: TensorDictBase) -> TensorDictBase:
        return td_to(td, self.device) if self.device is not None and td.device != self.device else td

    def _ended(self, nxt: TensorDictBase) -> torch.Tensor:
        """Which envs ended their episode in the step ``nxt``: one bool per env."""
        done: torch.Tensor | None = td_get(nxt, "done")
        if done is None:  # members without a "done" flag: the others say it
            done = torch.zeros(self.batch_size[:1], dtype=torch.bool)
            for flag in ("terminated", "truncated"):
                value: torch.Tensor | None = td_get(nxt, flag)
                if value is not None:
                    done = done | value.reshape(-1).bool()
        return done.reshape(-1).bool()

    def _kept_keys(self) -> list[tuple[str, ...]]:
        keys = [key_tuple(k) for k in self.full_observation_spec.keys(True, True)]
        return [*keys, *((flag,) for flag in FLAGS if (flag,) in self.full_done_spec.keys(True, True))]

    def _fill(self, out: TensorDictBase, names: tuple[str, ...]) -> TensorDictBase:
        """The pool's output laid out as the members' specs: their keys, shapes and dtypes."""
        return self._layout().fill(self, out, names)

    def _layout(self) -> OutputLayout:
        layout = self.__dict__.get("_output_layout")
        if layout is None:
            layout = self.__dict__["_output_layout"] = OutputLayout()
        return layout

    def _step_mdp_flat(
        self,
        tensordict: TensorDictBase,
        root: dict[str, Any] | None,
        nxt: TensorDictBase,
        ended: torch.Tensor | None,
        reset: Callable[[], TensorDictBase],
        plan: StepPlan,
    ) -> TensorDictBase | None:
        """TorchRL's ``step_mdp`` (keeping the action and other entries) then ``maybe_reset``
        for an input of tensors at its root: its entries but the reward and flags, the step's
        observations and flags, and the rows ``reset()`` makes where ``ended`` (None: no episode
        ended) (as TorchRL's ``maybe_reset``: unless every env was reset, entries the reset
        does not give, the action..., are zeros in those rows); None for other inputs.
        Those rows hold every env's next input (the step's observation where no episode
        ended), as the pool's step-and-reset gives it."""
        following = flat_entries(nxt)
        if root is None or following is None:
            return None
        rewards, not_carried = plan.rewards, plan.not_carried
        entries = {key: value for key, value in root.items() if key not in not_carried}
        entries.update({key: value for key, value in following.items() if key not in rewards})
        if ended is not None:
            rows = flat_entries(reset())
            if rows is None or not rows.keys() <= entries.keys():
                return None
            if not all(_flags(ended)):
                for key, value in entries.items():
                    if key not in rows:
                        entries[key] = value.masked_fill(ended.reshape(-1, *(1,) * (value.ndim - 1)), 0)
            # the reset rows are the step's own where no episode ended: whole columns
            entries.update(rows)
        return td_unchecked(entries, tensordict.batch_size, tensordict.device)

    def _set_seed(self, seed: int | None) -> None:
        self.set_seed(seed)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed worker ``k`` with the ``k``-th seed of TorchRL's chain; return the next seed.
        With ``static_seed``, every worker gets ``seed`` (TorchRL's members keep it unchanged)."""
        shim = self._running()
        if seed is None:
            return None
        if static_seed:
            if self._meta is not None:
                shim.call("set_seed", seed, static_seed=True)
            else:
                shim.reset(seed=seed)
            return seed
        return shim.set_seed(seed)

    def start(self) -> None:
        """Start the workers (TorchRL's ``BatchedEnvBase.start``); they start on first use anyway."""
        if self._shim is not None:
            raise RuntimeError("trying to start a environment that is not closed.")
        self._start()

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the pool (its workers); ``reset()`` afterwards starts it again, as in TorchRL.
        Closing a view (``env[idx]``) leaves its parent's workers running."""
        if self.is_view:
            self.close_view()
            return
        if self._shim is None:
            if raise_if_closed:
                raise RuntimeError("trying to close a closed environment")
            return
        shim, self._shim, self._wrapper = self._shim, None, None
        shim.close()

    @property
    def pool(self) -> Any:
        """The aenvs pool running the workers (started on first use)."""
        return self._running().pool


def _flags(ended: torch.Tensor) -> list[bool]:
    """One bool per env, as Python values (a torch reduction costs several times more here)."""
    flags: list[bool] = ended.tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return flags


def td_to(td: TensorDictBase, device: Any) -> TensorDictBase:
    moved: TensorDictBase = td.to(device)  # pyright: ignore[reportUnknownMemberType]
    return moved


def _bind(fn: Any, kwargs: dict[str, Any]) -> Any:
    import functools

    return functools.partial(fn, **kwargs)


def _reset_mask(tensordict: TensorDictBase, n: torch.Size) -> torch.Tensor | None:
    """One bool per worker from every ``"_reset"`` entry (nested ones reduced over their dims)."""
    masks: list[torch.Tensor] = [
        td_get(tensordict, key) for key in td_keys(tensordict, nested=True) if key_tuple(key)[-1] == "_reset"
    ]
    if not masks:
        return None
    return torch.stack([m.reshape(n[0], -1).any(-1) for m in masks], -1).any(-1)


def _flat(td: TensorDictBase, n: torch.Size) -> TensorDictBase:
    """Entries with a batch of their own (``[N, 3]``) kept, the TensorDict's batch cut to ``[N]``."""
    out = TensorDict({}, batch_size=n)
    for key in td_keys(td, nested=True, leaves=True):
        out.set(key, td_get(td, key))
    return out


class SerialEnv(_BatchedEnv):
    """TorchRL's ``SerialEnv``, run by an aenvs pool (``executor="inline"`` by default).

    Same constructor as ``torchrl.envs.SerialEnv`` (``num_workers``, ``create_env_fn``,
    ``create_env_kwargs``, ``device``, ...), plus ``executor=`` and the pool options of
    :class:`aenvs.SerialEnv`. TorchRL's memory / process options (``shared_memory``,
    ``use_buffers``, ``num_threads``, ``mp_start_method``...) are accepted and ignored; what
    TorchRL refuses is refused with its exceptions. Specs come from a member made in the
    parent (TorchRL members) or from the members' gymnasium spaces.

    Example:
        >>> from torchrl.envs import GymEnv
        >>> from aenvs.torchrl import SerialEnv
        >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"), executor="thread")
        >>> env.reset()["observation"].shape
        torch.Size([2, 4])
        >>> env.close()
    """

    _shim_class = _sync.SerialEnv
    _parallel = False


class ParallelEnv(_BatchedEnv):
    """TorchRL's ``ParallelEnv``, run by an aenvs pool (``executor="process"`` by default).

    See :class:`SerialEnv` for the arguments.

    Example:
        >>> from torchrl.envs import GymEnv
        >>> from aenvs.torchrl import ParallelEnv
        >>> env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"))
        >>> env.rollout(3).batch_size
        torch.Size([2, 3])
        >>> env.close()
    """

    _shim_class = _sync.ParallelEnv
    _parallel = True

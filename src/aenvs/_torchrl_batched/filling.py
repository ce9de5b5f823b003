"""The pool's outputs laid out as a batched env's specs: their keys, shapes and dtypes.

:class:`OutputLayout` keeps, per spec object, what it walks (a :class:`FillPlan`), so a
step reads its specs once. Specs of root tensors that the pool's output already has (the
usual case) take one unchecked TensorDict of the pool's tensors.

Example:
    >>> from torchrl.envs import GymEnv
    >>> from aenvs.torchrl import SerialEnv
    >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    >>> sorted(env.reset().keys())
    ['done', 'observation', 'terminated', 'truncated']
    >>> env.close()
"""

from __future__ import annotations

from typing import Any, cast

import torch
from tensordict import TensorDict, TensorDictBase

from aenvs._adapters.torchrl import Composite, NonTensor
from aenvs._tensors import flat_entries, from_numpy, td_get, td_unchecked

__all__ = ["FillPlan", "FlatLayout", "OutputLayout", "key_tuple", "tensors_of"]

FlatLayout = list[tuple[str, torch.Size, torch.dtype]]
"""Root tensor leaves of specs: (name, batched shape, dtype) per leaf."""

_ROOT_NAMES = ("done", "terminated", "truncated", "reward")


def key_tuple(key: Any) -> tuple[str, ...]:
    """A TorchRL nested key as a tuple of strings."""
    return (key,) if isinstance(key, str) else tuple(str(k) for k in key)


class OutputLayout:
    """Lays the pool's outputs out as a batched env's specs (``env``: its ``output_spec``,
    batch size and device), caching what it reads per spec object."""

    def __init__(self) -> None:
        self._plans: dict[str, FillPlan] = {}
        self._layouts: dict[tuple[str, ...], Any] = {}

    def fill(self, env: Any, out: TensorDictBase, names: tuple[str, ...]) -> TensorDictBase:
        """The pool's output laid out as the members' specs: their keys, shapes and dtypes."""
        entries = flat_entries(out)
        if entries is not None:
            flat = self._fill_flat(env, entries, names)
            if flat is not None:
                return flat
        result = TensorDict({}, batch_size=env.batch_size)
        for name in names:
            plan = self.plan(env, name)
            for key, batch in plan.subs:  # sub-TensorDicts first, with their own batch sizes
                if td_get(result, key) is None:
                    result.set(key, TensorDict({}, batch_size=batch))
            for key, leaf in plan.leaves:
                value: Any = td_get(out, key)
                if value is None and key[-1] in _ROOT_NAMES:
                    root: torch.Tensor | None = td_get(out, key[-1])
                    if root is not None:
                        value = _broadcast(root, leaf.shape, env.batch_dims)
                if value is None:
                    value = plan.zero(key, leaf)
                if isinstance(value, torch.Tensor):
                    if value.shape != leaf.shape:
                        value = value.reshape(leaf.shape)
                    if value.dtype != leaf.dtype:
                        value = value.to(leaf.dtype)
                elif hasattr(value, "reshape"):
                    value = value.reshape(leaf.shape).to(leaf.dtype)
                result.set(key, value)
            for key, cls in plan.classes:  # tensorclass entries: their class again
                result.set(key, cls.from_tensordict(td_get(result, key)))
        return result

    def _fill_flat(self, env: Any, entries: dict[str, Any], names: tuple[str, ...]) -> TensorDictBase | None:
        """:meth:`fill` for specs of root tensor leaves that the pool's output has, shaped as
        the specs say: their tensors (cast if need be) in one unchecked TensorDict; else None."""
        layout = self.flat_layout(env, names)
        if layout is None:
            return None
        values: dict[str, torch.Tensor] = {}
        for key, shape, dtype in layout:
            value = entries.get(key)
            if value is None or value.shape != shape:
                return None
            values[key] = value if value.dtype is dtype else value.to(dtype)
        device = env.device  # the pool's tensors are on the CPU: a CPU env's, as they are
        return td_unchecked(
            values, env.batch_size, device if device is not None and device.type == "cpu" else None
        )

    def flat_layout(self, env: Any, names: tuple[str, ...]) -> FlatLayout | None:
        """The root tensor leaves of the specs ``names`` (None if any spec has others), read
        once per set of spec objects."""
        specs: Any = getattr(env.__dict__.get("_output_spec"), "_specs", None)
        layouts = self._layouts
        cached = layouts.get(names)
        if cached is not None and isinstance(specs, dict):
            objects, layout = cached
            # the same spec objects (equal ones lay out the same): a tuple compares by identity first
            if tuple(map(cast(dict[str, Any], specs).get, names)) == objects:
                return layout
        plans = [self.plan(env, name) for name in names]
        layout = (
            None if any(p.flat is None for p in plans) else [leaf for p in plans for leaf in p.flat or ()]
        )
        layouts[names] = (tuple(p.spec for p in plans), layout)
        return layout

    def plan(self, env: Any, name: str) -> FillPlan:
        """What :meth:`fill` walks for the spec ``name``, read once per spec object."""
        specs: Any = getattr(env.__dict__.get("_output_spec"), "_specs", None)  # read without the lookup
        spec = cast(Any, specs[name] if isinstance(specs, dict) and name in specs else env.output_spec[name])
        plans = self._plans
        plan = plans.get(name)
        if plan is None or plan.spec is not spec:
            plan = plans[name] = FillPlan(spec)
        return plan


def tensors_of(columns: dict[tuple[str, ...], Any], layout: FlatLayout) -> dict[str, torch.Tensor]:
    """The numpy arrays of ``columns`` (a pool's, by key) that ``layout`` names, as tensors of
    its dtypes (no copy where the dtype is already that)."""
    values: dict[str, torch.Tensor] = {}
    for key, _, dtype in layout:
        value = from_numpy(columns[(key,)])
        values[key] = value if value.dtype is dtype else value.to(dtype)
    return values


def _broadcast(root: torch.Tensor, shape: torch.Size, batch_dims: int) -> torch.Tensor:
    """A root flag / reward (``[*batch, 1]``) over a nested entry's shape (``[*batch, 3, 1]``)."""
    if root.numel() == shape.numel():
        return root.reshape(shape)
    lead = root.reshape(*root.shape[:batch_dims], *(1,) * (len(shape) - batch_dims))
    return lead.expand(shape)


class FillPlan:
    """A spec's sub-TensorDicts (with their batch sizes), leaves and tensorclass entries, and
    the zeros of the leaves a result lacks, computed once."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.subs: list[tuple[tuple[str, ...], list[int]]] = []
        for key in spec.keys(True, False):
            key = key_tuple(key)
            sub = spec[key]
            if isinstance(sub, Composite):
                shape = list(sub.shape)  # a dynamic dim (-1, lazy specs) ends the batch
                self.subs.append((key, shape[: shape.index(-1)] if -1 in shape else shape))
        self.leaves: list[tuple[tuple[str, ...], Any]] = [
            (key_tuple(key), spec[key_tuple(key)]) for key in spec.keys(True, True)
        ]
        self.classes: list[tuple[tuple[str, ...], Any]] = [
            (key, cls)
            for key in sorted((key_tuple(k) for k in spec.keys(True, False)), key=len, reverse=True)
            if (cls := getattr(spec[key], "data_cls", None)) is not None
        ]
        self._zeros: dict[tuple[str, ...], Any] = {}
        # root tensor leaves only (the usual case): (key, shape, dtype) per leaf, else None
        self.flat: list[tuple[str, torch.Size, torch.dtype]] | None = None
        tensors_at_root = all(
            len(key) == 1 and isinstance(leaf.dtype, torch.dtype) and not isinstance(leaf, NonTensor)
            for key, leaf in self.leaves
        )
        if tensors_at_root and not self.subs and not self.classes:
            self.flat = [(key[0], leaf.shape, leaf.dtype) for key, leaf in self.leaves]

    def zero(self, key: tuple[str, ...], leaf: Any) -> Any:
        """The zeros of ``leaf`` (a fresh copy: the caller's result may be written into)."""
        zeros = self._zeros.get(key)
        if zeros is None:
            zeros = self._zeros[key] = leaf.zero()
        return zeros.clone()

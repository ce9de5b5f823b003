"""TorchRL 0.14's indexed views of a batched env (``env[idx]``, ``env[idx] = source``) and its
attribute forwarding (``env.attr`` per worker, ``env.nested.value``, ``env.f(x)``), as a mixin.

:class:`BatchedViews` is mixed into a TorchRL ``EnvBase`` over an aenvs pool. It needs from
the class: ``self.pool`` (the :class:`~aenvs.AsyncEnvPool`), ``self.num_workers``,
``self._run(coroutine_fn, *args, **kwargs)`` (runs a pool coroutine to its end, as the sync
shim's ``_run``), ``self.is_closed`` and, for :meth:`BatchedViews.update_kwargs`,
``self.create_env_kwargs`` (one dict per worker). In return the class routes each pool call
through :attr:`BatchedViews.worker_indices` (``env_index=self.worker_indices``: ``None`` for
the env that owns the pool, the view's workers for a view), calls
:meth:`BatchedViews.check_view` first in ``reset`` / ``step`` (TorchRL's errors for a closed
view or parent) and, in ``close``, :meth:`BatchedViews.close_view` for a view (which must not
close the parent's workers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from aenvs._errors import EnvError

__all__ = ["BatchedViews", "WorkerCall", "WorkerValues", "normalize_index"]


def normalize_index(item: Any, num_workers: int) -> list[int]:
    """A batched env's index (int, slice, 1-D int array or tensor) as worker indices, by
    TorchRL's rules: negative indices count from the end, bool masks and empty selections
    are refused (NotImplementedError / IndexError).

    Example:
        >>> normalize_index(-1, 4), normalize_index(slice(1, 3), 4), normalize_index([0, -1], 4)
        ([3], [1, 2], [0, 3])
    """
    if isinstance(item, bool | np.bool_):
        raise NotImplementedError("Boolean masks are not supported for batched envs.")
    if isinstance(item, int | np.integer):
        return [_checked(int(item), num_workers)]  # pyright: ignore[reportUnknownArgumentType]
    if isinstance(item, slice):
        indices = list(range(num_workers))[item]
        if not indices:
            raise IndexError("Empty batched env indexing is not supported.")
        return indices
    tensor = torch.as_tensor(item)
    if tensor.dtype == torch.bool:
        raise NotImplementedError("Boolean masks are not supported for batched envs.")
    if tensor.ndim == 0:
        return [_checked(int(tensor.item()), num_workers)]
    if tensor.ndim != 1:
        raise IndexError(f"Batched env indices must be scalar or 1D, got shape {tuple(tensor.shape)}.")
    if tensor.numel() == 0:
        raise IndexError("Empty batched env indexing is not supported.")
    return [_checked(int(value), num_workers) for value in tensor.to(torch.long)]


def _checked(index: int, num_workers: int) -> int:
    index = index + num_workers if index < 0 else index
    if not 0 <= index < num_workers:
        raise IndexError(f"index {index} is out of bounds for {num_workers} envs.")
    return index


class WorkerCall:
    """A method of every worker's env: calling it calls each and returns the list of results
    (TorchRL's ``_dispatch_caller_serial``); chained names (``env.nested.get_value``) are
    looked up on each env's attribute.

    Example:
        >>> WorkerCall([str.upper, str.lower])("Ab")
        ['AB', 'ab']
    """

    def __init__(self, methods: Sequence[Callable[..., Any]]) -> None:
        self.methods = list(methods)

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [method(*args, **kwargs) for method in self.methods]


class WorkerValues(list[Any]):
    """One value per worker (a list, as TorchRL's ``SerialEnv`` returns), whose attributes are
    looked up on every value: ``env.nested.value`` is ``[nested.value of env 0, ...]`` and
    ``env.nested.get_value()`` calls each (TorchRL's chained dispatch).

    Example:
        >>> values = WorkerValues([1 + 2j, 3 - 1j])
        >>> values.real, values.conjugate()
        ([1.0, 3.0], [(1-2j), (3+1j)])
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"Accessing private/special attribute {name!r} is not supported "
                "on dispatched batched env attributes."
            )
        values = [getattr(value, name) for value in self]
        if values and all(callable(value) for value in values):
            return WorkerCall(values)
        return WorkerValues(values)


class BatchedViews:
    """TorchRL's indexed views and attribute forwarding for a batched env over an aenvs pool
    (see the module's docstring for what the class mixing it in provides and does).

    - ``env[idx]`` (an int, a slice, a 1-D int array / tensor; negative indices allowed) is a
      live view of the same class over those workers: same pool, ``batch_size [len(idx)]``,
      the specs indexed; stepping it steps those envs only. Closing a view leaves the parent
      running; a view of a closed parent, or a closed view, raises RuntimeError on use.
      Bool masks raise NotImplementedError, as in TorchRL.
    - ``env[idx] = source`` writes a snapshot env (an ``EnvBase``, a list of them, or a
      TorchRL ``SerialEnv``'s members) into those workers' envs (``env[:] = source`` on each,
      TorchRL's writeback); NotImplementedError where the env cannot take it.
    - :meth:`forward_attr`: what ``__getattr__`` of the class returns for a name it does not
      have: a :class:`WorkerValues` list, or a :class:`WorkerCall` for methods.

    Example:
        >>> normalize_index(slice(None, None, 2), 4)
        [0, 2]
    """

    pool: Any
    num_workers: int
    is_closed: bool
    create_env_kwargs: list[dict[str, Any]]
    _run: Callable[..., Any]

    # -- what a view is -------------------------------------------------------------------

    @property
    def worker_indices(self) -> list[int] | None:
        """The pool's envs this env steps: ``None`` (all) for the env owning the pool."""
        return self.__dict__.get("_worker_indices")

    @property
    def parent_env(self) -> Any:
        """For a view, the env owning the pool (``None`` otherwise)."""
        return self.__dict__.get("_parent_env")

    @property
    def is_view(self) -> bool:
        """Whether this env is a view (``env[idx]``) of another's workers."""
        return self.__dict__.get("_parent_env") is not None

    def check_view(self) -> None:
        """Raise TorchRL's RuntimeError when a view is closed or its parent is."""
        if not self.is_view:
            return
        if self.is_closed:
            raise RuntimeError(
                "Cannot use a closed indexed batched environment view. "
                "Create a new view from the parent environment instead."
            )
        if self.parent_env.is_closed:
            self.is_closed = True
            raise RuntimeError(
                "Cannot use an indexed batched environment view after its parent environment has been closed."
            )

    def close_view(self) -> None:
        """Close a view: it is unusable after, its parent's workers run on."""
        self.is_closed = True

    def _started(self) -> None:
        """A view's checks; a closed env is started first (``start()``), as TorchRL's are."""
        self.check_view()
        if self.is_closed:
            start = getattr(self, "start", None)
            if start is None:
                raise RuntimeError("the batched env is closed")
            start()

    def _pool_index(self, indices: Sequence[int]) -> list[int]:
        """This env's ``indices`` as indices of the pool."""
        own = self.worker_indices
        return list(indices) if own is None else [own[i] for i in indices]

    def __getitem__(self, item: Any) -> Any:
        self._started()
        indices = normalize_index(item, self.num_workers)
        view: Any = type(self).__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.__dict__["_parent_env"] = self.parent_env or self
        view.__dict__["_worker_indices"] = self._pool_index(indices)
        view.__dict__["_batch_size"] = torch.Size([len(indices), *self.__dict__["_batch_size"][1:]])
        for name in ("_output_spec", "_input_spec"):
            spec = self.__dict__.get(name)
            if spec is not None:
                view.__dict__[name] = spec[indices].clone()
        if "num_workers" in self.__dict__:
            view.__dict__["num_workers"] = len(indices)
        for name in ("create_env_fn", "create_env_kwargs"):
            value = self.__dict__.get(name)
            if isinstance(value, list):
                view.__dict__[name] = [value[i] for i in indices]  # pyright: ignore[reportUnknownVariableType]
        return view

    def __setitem__(self, item: Any, source: Any) -> None:
        self._started()
        indices = normalize_index(item, self.num_workers)
        sources = _snapshot_sources(source, len(indices))
        for index, env in zip(self._pool_index(indices), sources, strict=True):
            try:
                self._run(self.pool.call, "__setitem__", slice(None), env, env_index=[index])
            except Exception as err:
                raise NotImplementedError(
                    f"The env of worker {index} does not support snapshot writeback: {err}"
                ) from err

    # -- attributes of the workers' envs --------------------------------------------------

    def forward_attr(self, name: str) -> Any:
        """Attribute ``name`` of each worker's env: a :class:`WorkerValues` list, or a
        :class:`WorkerCall` when they are methods (the call then runs in the workers)."""
        if name.startswith("__"):
            raise AttributeError(
                f"dispatching built-in private methods is not permitted. Got attribute {name}."
            )
        if self.is_closed:
            raise RuntimeError(
                "Trying to access attributes of closed/non started environments. Check that the "
                "batched environment has been started (e.g. by calling env.reset)"
            )
        index = self.worker_indices
        try:
            values: list[Any] = self._run(self.pool.get_attr, name, env_index=index)
        except EnvError as err:
            if "pickl" in err.remote_traceback:  # a method that cannot travel: call it where the env is
                return WorkerCall([_Remote(self, name, i) for i in range(self.num_workers)])
            if err.exc_type == "builtins.AttributeError":
                raise AttributeError(f"attribute {name} not found in the batched env's envs") from None
            raise
        if values and all(callable(value) for value in values):
            return WorkerCall([_Remote(self, name, i) for i in range(len(values))])
        return WorkerValues(values)

    def update_kwargs(self, kwargs: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Update the keyword arguments of each env's factory (one dict for all, or one per
        worker); they apply when the envs are built next (the first ``reset``, or after a
        ``close``). RuntimeError on a list of the wrong length, as TorchRL."""
        if isinstance(kwargs, dict):
            for own in self.create_env_kwargs:
                own.update(kwargs)
            return
        if len(kwargs) != self.num_workers:
            raise RuntimeError(
                f"len(kwargs) and num_workers mismatch, got {len(kwargs)} and {self.num_workers}."
            )
        for own, new in zip(self.create_env_kwargs, kwargs, strict=True):
            own.update(new)


class _Remote:
    """Method ``name`` of worker ``i``'s env, called where the env runs."""

    def __init__(self, env: BatchedViews, name: str, i: int) -> None:
        self.env, self.name, self.i = env, name, i

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        env = self.env
        (result,) = env._run(env.pool.call, self.name, *args, env_index=env._pool_index([self.i]), **kwargs)  # pyright: ignore[reportPrivateUsage]
        return result


def _snapshot_sources(source: Any, expected: int) -> list[Any]:
    """The envs to write back (TorchRL's ``_indexed_snapshot_sources``)."""
    from aenvs._adapters.torchrl import EnvBase  # torchrl is optional: imported when used

    envs: list[Any]
    if isinstance(source, BatchedViews):
        raise NotImplementedError(
            "Writing back from an aenvs batched env is not supported; use an EnvBase snapshot instead."
        )
    if isinstance(source, EnvBase):
        inner: Any = getattr(source, "_envs", None)  # a TorchRL SerialEnv's members
        envs = [*inner] if isinstance(inner, list) else [source]
    elif isinstance(source, Sequence):
        envs = list(source)  # pyright: ignore[reportUnknownArgumentType]
    else:
        raise TypeError(f"Expected an EnvBase or sequence of EnvBase sources, got {type(source).__name__}.")
    if len(envs) != expected:
        raise ValueError(
            "The source count does not match the indexed destination: "
            f"got {len(envs)} and expected {expected}."
        )
    if not all(isinstance(env, EnvBase) for env in envs):
        raise TypeError("All indexed sources must be EnvBase instances.")
    return envs

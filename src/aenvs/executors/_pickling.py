"""Pickling with cloudpickle, typed: env factories and call arguments that plain pickle refuses.

cloudpickle ships no type annotations; this module is the one place that imports it. Its
``loads`` is :func:`pickle.loads`: what it pickled unpickles with plain pickle.
"""

from __future__ import annotations

import cloudpickle  # pyright: ignore[reportMissingTypeStubs] - cloudpickle ships no annotations

__all__ = ["cloudpickle_dumps"]


def cloudpickle_dumps(obj: object) -> bytes:
    """``obj`` pickled with cloudpickle: lambdas, closures and local classes travel by value.

    Example:
        >>> import pickle
        >>> pickle.loads(cloudpickle_dumps(lambda x: x + 1))(1)
        2
    """
    return cloudpickle.dumps(obj)  # pyright: ignore[reportUnknownMemberType] - no annotations

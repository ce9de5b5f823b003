"""Rows of an array picked and placed by index without numpy letting go of the GIL.

numpy releases the GIL in ``take`` and in fancy indexing along the first axis of an
array of more than one dimension, however few the rows. On the event loop's thread,
with env threads waiting for the GIL, each release hands it to one of them, and the
loop's thread then waits for it behind the others (docs/performance.md: 67 us a call
at 256 env threads, against 0.4 us alone). A 1-D array of one item per row, whose
fancy indexing numpy runs holding the GIL below 500 items, picks and places the same
rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["pick_rows", "put_rows", "row_items"]


def row_items(array: npt.NDArray[Any]) -> npt.NDArray[np.void] | None:
    """``array`` viewed as one item per row (its bytes); None where that is no view of it
    (a 1-D array, whose fancy indexing needs none; object entries; rows not contiguous).

    Example:
        >>> row_items(np.zeros((4, 3), np.float32)).shape
        (4,)
    """
    if array.ndim < 2 or array.dtype.hasobject or not array.flags.c_contiguous or array.size == 0:
        return None
    n = len(array)
    return array.reshape(n, -1).view(np.dtype((np.void, array.nbytes // n))).reshape(n)


def pick_rows(
    array: npt.NDArray[Any],
    rows: npt.NDArray[np.int64] | Sequence[int],
    items: npt.NDArray[np.void] | None = None,
) -> npt.NDArray[Any]:
    """``array.take(rows, axis=0)`` (a copy), holding the GIL; ``items``: ``row_items(array)``,
    when the caller keeps it.

    Example:
        >>> pick_rows(np.arange(6).reshape(3, 2), np.array([2, 0]))
        array([[4, 5],
               [0, 1]])
    """
    if array.ndim < 2:
        return array[rows]
    if items is None:
        items = row_items(array)
        if items is None:
            return array.take(rows, axis=0)
    return items[rows].view(array.dtype).reshape(len(rows), *array.shape[1:])


def put_rows(
    array: npt.NDArray[Any],
    rows: npt.NDArray[np.int64] | Sequence[int],
    values: npt.NDArray[Any] | np.generic,
    items: npt.NDArray[np.void] | None = None,
) -> None:
    """``array[rows] = values`` (``values`` one per row, or broadcast to them), holding the GIL.

    Example:
        >>> a = np.zeros((3, 2))
        >>> put_rows(a, [2, 0], np.ones((2, 2)))
        >>> a.sum(axis=1)
        array([2., 0., 2.])
    """
    if array.ndim >= 2 and len(rows):
        if items is None:
            items = row_items(array)
        if items is not None:
            shape = (len(rows), *array.shape[1:])
            if values.shape != shape or values.dtype != array.dtype or not values.flags.c_contiguous:
                values = np.ascontiguousarray(np.broadcast_to(values, shape), array.dtype)
            items[rows] = values.reshape(len(rows), -1).view(items.dtype).reshape(len(rows))
            return
    array[rows] = values

"""Latency windows: per env, the most recent samples of a latency series, and their percentiles.

The samples of every env live in one preallocated ring of ``num_envs x WINDOW`` float32s
(an ``array.array``, which numpy reads without a copy; a float32 resolves 4 us at a
minute), env ``i``'s in its row, written at its count modulo :data:`WINDOW`. A sample is
written where the slot table already loops over the envs of a batch, in O(1) and with no
allocation; the percentiles are computed only when :meth:`~aenvs.AsyncEnvPool.stats` asks,
over every env's window at once: one sort of every row (numpy sorts short rows fast), one
gather.

The pool-wide percentiles are exact up to :data:`POOL_SAMPLES` samples in all; beyond, they
are estimated from that many of them drawn at random (the standard error of the estimate's
rank: 0.2 percentile at p50, 0.04 at p99), which keeps ``stats()`` a few milliseconds at
thousands of envs.
"""

from __future__ import annotations

from array import array
from functools import cache

import numpy as np
import numpy.typing as npt

from aenvs._pool.stats import LatencyPercentiles

__all__ = ["MASK", "POOL_SAMPLES", "SHIFT", "WINDOW", "LatencyWindows"]

WINDOW = 256  # samples kept per env and series (a power of two: a slot is ``count & MASK``)
SHIFT = WINDOW.bit_length() - 1  # env i's row starts at ``i << SHIFT``
MASK = WINDOW - 1
POOL_SAMPLES = 65_536  # pool-wide percentiles: exact up to this many samples, estimated beyond

_QUANTILES = np.array([0.5, 0.9, 0.99])


class LatencyWindows:
    """Per env, a window of the last :data:`WINDOW` samples (seconds) of one latency series.

    ``ring`` holds env ``i``'s samples at ``[i << SHIFT, (i + 1) << SHIFT)`` and ``counts[i]``
    how many it ever got. :meth:`add` records a sample; a hot loop does the same inline::

        c = counts[i]
        ring[(i << SHIFT) | (c & MASK)] = seconds
        counts[i] = c + 1

    Example:
        >>> windows = LatencyWindows(2)
        >>> for seconds in (0.1, 0.2, 0.3):
        ...     windows.add(0, seconds)
        >>> p = windows.percentiles()
        >>> round(p.p50[0], 3), p.p50[1], p.samples
        (0.2, 0.0, [3, 0])
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        # NaN in the slots not written yet: sorted last, out of every percentile
        self.ring = array("f", [float("nan")]) * (num_envs * WINDOW)
        self.counts = [0] * num_envs  # samples each env ever got
        self._rows: npt.NDArray[np.float32] = np.frombuffer(self.ring, dtype=np.float32).reshape(
            num_envs, WINDOW
        )
        self._sorted: npt.NDArray[np.float32] | None = None  # the rows sorted, by percentiles()

    def add(self, env_index: int, seconds: float) -> None:
        """Record one sample of env ``env_index``."""
        c = self.counts[env_index]
        self.ring[(env_index << SHIFT) | (c & MASK)] = seconds
        self.counts[env_index] = c + 1

    def add_to_all(self, seconds: float) -> bool:
        """Record one sample of ``seconds`` for every env, when every env has had as many
        samples (a lockstep loop's batches): one column written at C speed. False, and
        nothing recorded, when the counts differ (then :meth:`add` env by env).

        Example:
            >>> windows = LatencyWindows(3)
            >>> windows.add_to_all(0.5), windows.counts
            (True, [1, 1, 1])
            >>> windows.add(0, 0.1)
            >>> windows.add_to_all(0.5), windows.counts
            (False, [2, 1, 1])
        """
        counts, n = self.counts, self.num_envs
        c = counts[0]
        if counts.count(c) != n:
            return False
        self.ring[c & MASK :: WINDOW] = array("f", [seconds]) * n
        counts[:] = [c + 1] * n
        return True

    def clear(self) -> None:
        """Forget every sample."""
        self._rows.fill(np.nan)
        self.counts[:] = [0] * self.num_envs

    def percentiles(self) -> LatencyPercentiles:
        """p50 / p90 / p99 of each env's window (0.0 where it is empty) and of all windows together."""
        num_envs = self.num_envs
        samples = np.minimum(np.array(self.counts, dtype=np.intp), WINDOW)
        total = int(samples.sum())
        if total == 0:
            return LatencyPercentiles.empty(num_envs)
        rows, ordered = self._rows, self._sorted
        if ordered is None:  # kept: a new array each call would cost its page faults each call
            ordered = self._sorted = np.empty_like(rows)
        np.copyto(ordered, rows)
        ordered.sort(axis=1)
        full = total == num_envs * WINDOW  # the usual case once every window filled: no NaN
        per_env = _row_percentiles(ordered, samples, full)
        values = rows.reshape(-1) if full else rows[~np.isnan(rows)]
        if total > POOL_SAMPLES:
            values = values[(_picks() * total).astype(np.intp)]
        pool = np.percentile(values, (50, 90, 99)).astype(np.float64).tolist()
        p50, p90, p99 = per_env.tolist()
        return LatencyPercentiles(p50, p90, p99, pool[0], pool[1], pool[2], samples.tolist())


def _row_percentiles(
    ordered: npt.NDArray[np.float32], samples: npt.NDArray[np.intp], full: bool
) -> npt.NDArray[np.float64]:
    """p50 / p90 / p99 (``[3, num_envs]``) of each row of ``ordered`` (sorted, its first
    ``samples[i]`` entries filled), interpolated as ``np.percentile`` does; 0.0 for an empty row."""
    last = np.maximum(samples - 1, 0)[:, None]
    position = last * _QUANTILES  # [num_envs, 3]
    below = np.floor(position).astype(np.intp)
    above = np.minimum(below + 1, last)
    if full:  # every row alike: columns, not a gather
        a, b = ordered[:, below[0]], ordered[:, above[0]]
    else:
        a, b = np.take_along_axis(ordered, below, axis=1), np.take_along_axis(ordered, above, axis=1)
    t = position - below
    a, b = a.astype(np.float64), b.astype(np.float64)
    gap = b - a
    values = np.where(t >= 0.5, b - gap * (1 - t), a + gap * t)  # numpy's lerp: exact at both ends
    if not full:
        values[samples == 0] = 0.0
    return values.T


@cache
def _picks() -> npt.NDArray[np.float64]:
    """:data:`POOL_SAMPLES` fixed uniform draws in [0, 1), sorted (the gather reads in order)."""
    return np.sort(np.random.default_rng(0).random(POOL_SAMPLES))

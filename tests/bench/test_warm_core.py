"""benchmarks/warm_core.py's loop-bound rows: the script runs against the current API and
its figures are what it measured (positive CPU per step, every batch of the overlapped loop)."""

from __future__ import annotations

import asyncio

from benchmarks import warm_core


def test_loop_bound_rows_measure_the_pool_and_its_bare_reference() -> None:
    lines = asyncio.run(warm_core.loop_bound(0.05))
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [int(row[0]) for row in rows] == list(warm_core.LOOP_BOUND_NS)
    for n, pool, bare, own, batch, full_gcs in rows:
        assert float(pool) > float(bare) > 0
        assert abs(float(pool) - float(bare) - float(own)) < 0.011
        assert 1 <= float(batch) <= int(n)
        assert int(full_gcs) >= 0

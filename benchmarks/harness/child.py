"""Runs one benchmark's function in this fresh interpreter and writes its rows as JSON.

``aenvs bench`` starts one of these per benchmark, with the checkout's root on its path:

    python -m benchmarks.harness.child --module benchmarks.latency --function measure \\
        --kwargs '{"duration": 0.3}' --rows rows.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

__all__ = ["as_row", "main"]


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples as lists, NaN and infinities as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def as_row(row: Any) -> dict[str, Any]:
    """One row (a dataclass instance or a mapping) as a JSON-ready dict.

    Example:
        >>> as_row({"n": 8, "steps_per_s": float("nan")})
        {'n': 8, 'steps_per_s': None}
    """
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        row = dataclasses.asdict(row)
    if not isinstance(row, Mapping):
        raise TypeError(
            f"a benchmark row must be a dataclass instance or a mapping, got {type(row).__name__}"
        )
    return _plain(row)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--module", required=True, help="the benchmark's module")
    parser.add_argument("--function", required=True, help="its function that measures and returns rows")
    parser.add_argument("--kwargs", default="{}", help="keyword arguments for it, as JSON")
    parser.add_argument("--rows", required=True, help="where to write the rows, as JSON")
    args = parser.parse_args(argv)

    spec = importlib.util.find_spec(args.module)
    if spec is not None and spec.origin is not None:  # as when run as a script: it may import its siblings
        sys.path.insert(0, str(Path(spec.origin).parent))
    module = importlib.import_module(args.module)
    # as when it runs as a script (its module is __main__ there), its own functions and classes
    # travel to worker processes by value: a worker must not import the whole benchmark (torch
    # and all) to unpickle an env factory, or start-up and memory figures are not the script's
    cloudpickle.register_pickle_by_value(module)
    function = getattr(module, args.function)
    result = function(**json.loads(args.kwargs))
    if inspect.isawaitable(result):
        raise TypeError(f"{args.module}.{args.function} must run its own event loop and return rows")
    rows = [as_row(row) for row in result]
    Path(args.rows).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(rows)} rows", flush=True)
    return 0


if __name__ == "__main__":  # spawned workers (TorchRL's) re-import this module: keep the guard
    sys.exit(main())

"""Variable-length entries: three ways to hold one entry whose tensors differ in shape per env.

For a batch of N per-env tensors (int64 token ids of 10-2,000 ids, float32 point clouds
``[k, 3]`` of 10-2,000 points), each form is built as the entry of a batch ``[N]`` and used:

- ``lazy``: a ``LazyStackedTensorDict`` of per-env TensorDicts (what a lazy pool returns;
  ``get`` needs ``as_list`` / ``as_nested_tensor`` / ``as_padded_tensor``);
- ``jagged``: a jagged nested tensor (``torch.nested.as_nested_tensor(rows, layout=torch.jagged)``)
  as the entry of a dense TensorDict;
- ``stack``: a lazy stack at the entry's key in a dense TensorDict (``NonTensorStack``, one
  row per env holding its tensor: what a dense pool returns, ``aenvs._ragged``).

Costs per batch (microseconds, median of ``--repeats``): ``build``, ``row`` (one env's
tensor, ``td[i][key]``), ``list`` (every row as a tensor), ``pad`` (a padded ``[N, max, ...]``
batch) and ``cat`` (every row concatenated), and ``jagged`` (the stack turned into a jagged
tensor, the policy's one call). Then which batch operations each form survives (row indexing,
slicing, stacking over time, ``torch.where``, clone, ``to``, unbind, pickle), under the
tensordict this Python has. Run it under both venvs (tensordict 0.15 and TorchRL's 0.14 pin).

Run:
    python benchmarks/ragged.py --num-envs 8 64 512 --repeats 7
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import tensordict
import torch
from tensordict import LazyStackedTensorDict, NonTensorStack, TensorDict, TensorDictBase

from aenvs._ragged import as_jagged

KEY = "x"

# torch functions dispatching on TensorDicts (their annotations only name tensors)
td_stack = cast("Callable[[list[TensorDictBase], int], TensorDictBase]", torch.stack)
td_where = cast("Callable[[torch.Tensor, TensorDictBase, TensorDictBase], TensorDictBase]", torch.where)


def rows_of(kind: str, n: int, seed: int = 0) -> list[torch.Tensor]:
    """N per-env tensors of 10-2,000 items: token ids [k] or a point cloud [k, 3]."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(10, 2001, (n,), generator=g).tolist()
    if kind == "tokens":
        return [torch.randint(0, 50_000, (k,), generator=g) for k in sizes]
    return [torch.randn(k, 3, generator=g) for k in sizes]


def build(form: str, rows: list[torch.Tensor]) -> TensorDictBase:
    n = len(rows)
    if form == "lazy":
        return LazyStackedTensorDict.lazy_stack([TensorDict({KEY: t}, []) for t in rows])
    if form == "jagged":
        return TensorDict({KEY: torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [n])
    entries: list[Any] = list(rows)
    return TensorDict({KEY: NonTensorStack.from_list(entries)}, [n])


def as_list(form: str, td: TensorDictBase) -> list[torch.Tensor]:
    if form == "lazy":
        get: Callable[..., list[torch.Tensor]] = td.get  # a lazy stack's keywords, not in get's overloads
        return get(KEY, as_list=True)
    if form == "jagged":
        return list(td.get(KEY).unbind())
    return td.get(KEY).tolist()


def pad(form: str, td: TensorDictBase) -> torch.Tensor:
    if form == "lazy":
        get: Callable[..., torch.Tensor] = td.get  # a lazy stack's keywords, not in get's overloads
        return get(KEY, as_padded_tensor=True)
    if form == "jagged":
        return td.get(KEY).to_padded_tensor(0.0)
    return torch.nn.utils.rnn.pad_sequence(as_list(form, td), batch_first=True)


def cat(form: str, td: TensorDictBase) -> torch.Tensor:
    if form == "jagged":
        return td.get(KEY).values()
    return torch.cat(as_list(form, td))


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median microseconds per call over ``repeats`` windows of enough calls for ~20 ms."""
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.02:
        fn()
        calls += 1
    per_window = max(1, calls)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(per_window):
            fn()
        samples.append((time.perf_counter() - start) / per_window * 1e6)
    return statistics.median(samples)


def costs(form: str, rows: list[torch.Tensor], repeats: int) -> dict[str, float]:
    td = build(form, rows)
    n = len(rows)
    out = {
        "build": timed(lambda: build(form, rows), repeats),
        "row": timed(lambda: td[n // 2][KEY], repeats),
        "list": timed(lambda: as_list(form, td), repeats),
        "pad": timed(lambda: pad(form, td), repeats),
        "cat": timed(lambda: cat(form, td), repeats),
    }
    if form == "stack":
        out["jagged"] = timed(lambda: as_jagged(as_list(form, td)), repeats)
    return out


def survives(form: str, rows: list[torch.Tensor]) -> dict[str, bool]:
    """Which batch operations work on a batch holding the entry (and give every row back)."""
    td = build(form, rows)
    n = len(rows)
    mask = torch.arange(n) % 2 == 0
    ops: dict[str, Callable[[], Any]] = {
        "td[idx]": lambda: as_list(form, td[torch.tensor([0, n - 1])]),
        "td[1:]": lambda: as_list(form, td[1:]),
        "td[mask]": lambda: as_list(form, td[mask]),
        "stack over time": lambda: td_stack([td, build(form, rows)], 1)[0, 1][KEY],
        "lazy_stack": lambda: LazyStackedTensorDict.lazy_stack([td, td], 1)[0, 1][KEY],
        "where": lambda: as_list(form, td_where(mask, td, td)),
        "clone": lambda: as_list(form, td.clone()),
        "to": lambda: as_list(form, td.to("cpu")),
        "unbind": lambda: [t[KEY] for t in td.unbind(0)],
        "pickle": lambda: as_list(form, pickle.loads(pickle.dumps(td))),
    }
    result: dict[str, bool] = {}
    for name, op in ops.items():
        try:
            op()
            result[name] = True
        except Exception:
            result[name] = False
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    forms = ("lazy", "jagged", "stack")
    print(f"torch {torch.__version__}, tensordict {tensordict.__version__}; microseconds per batch")
    print(
        f"{'kind':7} {'N':>4} {'form':7} {'build':>9} {'row':>8} {'list':>9} {'pad':>9} {'cat':>9} {'jagged':>9}"
    )
    for kind in ("tokens", "cloud"):
        for n in args.num_envs:
            rows = rows_of(kind, n)
            for form in forms:
                c = costs(form, rows, args.repeats)
                extra = f"{c['jagged']:9.0f}" if "jagged" in c else f"{'':>9}"
                print(
                    f"{kind:7} {n:4d} {form:7} {c['build']:9.0f} {c['row']:8.1f} {c['list']:9.0f} "
                    f"{c['pad']:9.0f} {c['cat']:9.0f} {extra}"
                )
    print("\nbatch operations survived (tokens, N=8):")
    for form in forms:
        ok = survives(form, rows_of("tokens", 8))
        print(f"  {form:7} " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ok.items()))


if __name__ == "__main__":
    main()

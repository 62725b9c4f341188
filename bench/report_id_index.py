"""The report-id index alone: CPU per id to check a batch and add its new ids, by size.

    PYTHONPATH=. .venv/bin/python bench/report_id_index.py [--sizes 1000000,8000000]
        [--batch 100000] [--other DIR] [--repeats 1] [--warm-mb 2048]

Fills a ``ReportIdIndex`` with batches of ``--batch`` random 16-byte ids (as the SDK draws
them) until it holds each of ``--sizes`` ids: per batch, the membership test, then adding
the ids not present, as the stores call them (``check`` then ``record``; an index without
them, ``present`` then ``add``). Prints CPU time (``time.process_time``) per id
over the whole fill (growth included), over the last tenth (the index near that size),
and the slowest single call (a stall of ingest, e.g. while the table grows), plus the
index's bytes per id. ``--other DIR``: also the ``aggregator/store/report_ids.py`` of
another checkout (``git archive <commit> | tar -x -C DIR``), the two taking turns per size.
``--warm-mb``: memory touched once before measuring (on a VM the first touch of memory
the guest never used costs more than the work: without it, the first run pays for it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def index_class(tree: Path, name: str) -> Any:
    """The tree's ``ReportIdIndex``, with the tree's own slot table module (if it has
    one) standing in for the package's while its module is loaded."""
    store = tree / "aggregator" / "store"
    if not (store / "report_ids.py").exists():
        raise SystemExit(f"no aggregator/store/report_ids.py under {tree}")
    table = "crowdmix.aggregator.store.report_id_table"
    saved = sys.modules.get(table)
    try:
        if (store / "report_id_table.py").exists():
            sys.modules[table] = _load(store / "report_id_table.py", f"{name}_table")
        return _load(store / "report_ids.py", name).ReportIdIndex
    finally:
        if saved is None:
            sys.modules.pop(table, None)
        else:
            sys.modules[table] = saved


def fill(cls: Any, size: int, batch: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    index = cls()
    tail_from = size - size // 10
    cpu = {"present": 0.0, "add": 0.0, "tail": 0.0, "worst": 0.0}
    done = tail_n = 0
    while done < size:
        n = min(batch, size - done)
        ids = rng.bytes(16 * n)
        t0 = time.process_time()
        if hasattr(index, "check"):  # check, then record what the check found
            check = index.check(ids)
            positions = check.present
            t1 = time.process_time()
            index.record(check)
        else:  # present, then add the ids not present
            positions = index.present(ids)
            t1 = time.process_time()
            index.add(ids)
        t2 = time.process_time()
        if positions.size:  # a random 128-bit id repeats with probability ~0
            raise SystemExit("a fresh id was found present")
        cpu["present"] += t1 - t0
        cpu["add"] += t2 - t1
        cpu["worst"] = max(cpu["worst"], t1 - t0, t2 - t1)
        if done >= tail_from:
            cpu["tail"] += t2 - t0
            tail_n += n
        done += n
    if len(index) != size:
        raise SystemExit(f"index holds {len(index)} ids, expected {size}")
    return {
        "present": cpu["present"] / size * 1e9,
        "add": cpu["add"] / size * 1e9,
        "tail": cpu["tail"] / max(tail_n, 1) * 1e9,
        "worst": cpu["worst"] * 1e3,
        "bytes": index.nbytes / size,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1000000,8000000")
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--other", type=Path, help="a checkout to compare against")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warm-mb", type=int, default=2048)
    args = ap.parse_args()
    if args.warm_mb:
        np.ones(args.warm_mb << 17, dtype=np.uint64)
    trees = [("this", index_class(HERE, "this_report_ids"))]
    if args.other:
        trees.append(("other", index_class(args.other, "other_report_ids")))
    print(f"load average at start: {os.getloadavg()[0]:.2f}; batches of {args.batch} ids")
    print("tree   ids        test  add ns/id (whole fill)  near size  worst call  bytes/id")
    for size in (int(s) for s in args.sizes.split(",")):
        for r in range(args.repeats):
            for name, cls in trees:
                f = fill(cls, size, args.batch, seed=size + r)
                print(
                    f"{name:<6} {size:>9}  {f['present']:7.0f}  {f['add']:7.0f}"
                    f"  = {f['present'] + f['add']:5.0f}          {f['tail']:7.0f}"
                    f"  {f['worst']:7.0f} ms  {f['bytes']:6.0f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

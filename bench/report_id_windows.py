"""The Redis count store's apply with report ids, this tree against another, interleaved.

    .venv/bin/python bench/report_id_windows.py --other DIR [--seconds 60] [--sizes 1000,100000]

``--other`` is a checkout of another commit (``git archive <commit> | tar -x -C DIR``); its
``aggregator/store/redis.py`` is loaded next to this tree's, both on one redis-server (AOF,
appendfsync everysec, loopback), each on a metric of its own. Batches of m=64 cohorts,
k=128 bits, counted once up front; every report has a fresh id (as the SDK sends), so
each apply checks its ids against the cached indexes, runs the apply script and appends
the ids. The two stores take turns in slices of ``--slice`` seconds for ``--seconds``
in all, so a load that drifts (a shared box) hits both alike; it prints each one's
reports/s and the ratio this/other per batch size: overall, of the median turns and of
the best turns. No gRPC, no counting: the part of
ingest that the report-id check changes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.store.base import ReportIds
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import RedisServer

M, K = 64, 128


def other_store_class(tree: Path) -> Any:
    spec = importlib.util.spec_from_file_location(
        "other_redis_store", tree / "aggregator" / "store" / "redis.py"
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"no aggregator/store/redis.py under {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.RedisCountStore


class Applier:
    """Applies batches of ``n`` fresh-id reports to ``metric`` through ``store``."""

    def __init__(self, store: Any, metric: str, n: int, window: int) -> None:
        rng = np.random.default_rng(n)
        self.store, self.metric, self.n, self.window = store, metric, n, window
        self.delta = CohortCounts.create(M, K)
        self.delta.add(
            rng.integers(0, M, n).astype(np.int64),
            rng.integers(0, 256, (n, K // 8), dtype=np.uint8),
        )
        self.salt = np.frombuffer(os.urandom(8), dtype="<u8")[0]
        self.next = 0
        self.done = 0
        self.busy = 0.0
        self.slices: list[float] = []  # reports/s of each turn

    def ids(self) -> bytes:
        words = np.empty((self.n, 2), dtype="<u8")
        words[:, 0] = np.arange(self.next, self.next + self.n, dtype=np.uint64) + 1
        words[:, 1] = self.salt
        self.next += self.n
        return words.tobytes()

    def run(self, seconds: float) -> None:
        start, before = time.perf_counter(), self.done
        while time.perf_counter() - start < seconds:
            rids = ReportIds(self.ids(), lambda _p: self.delta)
            outcome = self.store.apply_reports(
                self.metric, self.window, os.urandom(16), 1, self.delta, rids
            )
            assert outcome.applied and outcome.duplicates == 0, outcome
            self.done += self.n
        took = time.perf_counter() - start
        self.busy += took
        self.slices.append((self.done - before) / took)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--other", type=Path, required=True, help="checkout of the other commit")
    ap.add_argument("--seconds", type=float, default=60.0, help="per batch size, both stores")
    ap.add_argument("--slice", type=float, default=1.0)
    ap.add_argument("--sizes", default="1000,100000")
    args = ap.parse_args()
    other_cls = other_store_class(args.other)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; m={M} k={K}, fresh report ids")
    work = Path(tempfile.mkdtemp(prefix="crowdmix-bench-"))
    server = RedisServer(appendonly=True, directory=str(work / "redis"))
    server.start()
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            this = Applier(RedisCountStore.from_url(server.url), f"this{n}", n, 20_000)
            other = Applier(other_cls.from_url(server.url), f"other{n}", n, 20_000)
            end = time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                this.run(args.slice / 2)
                other.run(args.slice / 2)
            a, b = this.done / this.busy, other.done / other.busy
            # per turn: the median resists a load that drifts, the best a load that spikes
            ma, mb = float(np.median(this.slices)), float(np.median(other.slices))
            print(
                f"batch {n:>7}: this {a / 1e6:6.3f}, other {b / 1e6:6.3f} M reports/s, "
                f"this/other {a / b:.3f}, median turn {ma / mb:.3f}, best turn "
                f"{max(this.slices) / max(other.slices):.3f} ({this.done} and {other.done} "
                f"reports, {len(this.slices)} turns each; load {os.getloadavg()[0]:.2f})"
            )
            this.store.close()
            other.store.close()
    finally:
        server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

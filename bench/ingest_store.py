"""Count store write path: which Redis design applies batches exactly once fastest?

    .venv/bin/python bench/ingest_store.py [--seconds 3] [--m 64] [--k 128]

For batches of 1000 and 100 000 reports (m cohorts, k bits), counted in numpy
first, it measures applied reports/s of

- ``lua-hincrby``: one Lua script per batch that SADDs the batch id and HINCRBYs
  every non-zero (cohort, bit) cell and cohort total (design (a));
- ``delta-blob``: ``RedisCountStore.apply`` — one Lua script per batch that SADDs the
  id and HSETs one compact per-batch delta, folded later (design (b), the one used);
- ``delta-blob+fold``: the same with the daemon's fold running concurrently;
- ``memory``: ``MemoryCountStore.apply`` (the embedded default), for reference.

Redis runs with AOF, appendfsync everysec, on loopback. The store alone must not be
the bottleneck of the ingest target (>= 10 M reports/s).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.store.base import CountStore
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import RedisServer

_HINCRBY = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
"""


def make_delta(m: int, k: int, n: int, seed: int) -> CohortCounts:
    rng = np.random.default_rng(seed)
    c = CohortCounts.create(m, k)
    c.add(
        rng.integers(0, m, n).astype(np.int64),
        rng.integers(0, 256, (n, (k + 7) // 8), dtype=np.uint8),
    )
    return c


def run_store(store: CountStore, delta: CohortCounts, n: int, seconds: float) -> float:
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        store.apply("bench", 1, os.urandom(16), 1, delta)
        done += n
    return done / (time.perf_counter() - start)


def run_hincrby(client: redis.Redis, delta: CohortCounts, n: int, seconds: float) -> float:
    script = client.register_script(_HINCRBY)
    totals, ones = delta.totals, delta.ones
    args: list[bytes | str | int] = []
    for c in np.flatnonzero(totals):
        args += [f"t{c}", int(totals[c])]
    for c, i in zip(*np.nonzero(ones), strict=True):
        args += [f"{c}:{i}", int(ones[c, i])]
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        script(keys=["bench:{h}:ids", "bench:{h}:counts"], args=[os.urandom(16), *args])
        done += n
    return done / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--k", type=int, default=128)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; m={args.m} k={args.k}")
    server = RedisServer(appendonly=True)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        for n in (1000, 100_000):
            delta = make_delta(args.m, args.k, n, seed=n)
            client.flushall()
            rate = run_hincrby(client, delta, n, args.seconds)
            print(f"batch {n:>7}: lua-hincrby      {rate / 1e6:8.2f} M reports/s")
            client.flushall()
            store = RedisCountStore(client)
            rate = run_store(store, delta, n, args.seconds)
            print(f"batch {n:>7}: delta-blob       {rate / 1e6:8.2f} M reports/s")
            client.flushall()
            stop = threading.Event()

            def fold(store: RedisCountStore = store, stop: threading.Event = stop) -> None:
                while not stop.wait(1.0):  # the daemon's cadence
                    store.maintain()

            folder = threading.Thread(target=fold)
            folder.start()
            rate = run_store(store, delta, n, args.seconds)
            stop.set()
            folder.join()
            print(f"batch {n:>7}: delta-blob+fold  {rate / 1e6:8.2f} M reports/s")
            rate = run_store(MemoryCountStore(), delta, n, args.seconds)
            print(f"batch {n:>7}: memory           {rate / 1e6:8.2f} M reports/s")
        print("target: the store alone well above 10 M reports/s")
    finally:
        server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

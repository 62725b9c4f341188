"""Memory per buffered (pending) report, in both stores.

    .venv/bin/python bench/shuffler_memory.py [--reports 1000000]

A RAPPOR report of k = 128 bits is 16 bytes of bits + a 4-byte cohort. The
stores keep reports in chunks, one per group-commit write and metric, so the
per-report cost depends on how many reports a write carries: 1000 (bulk
senders, or heavy coalescing) and 1 (the worst case: a lone device report per
write). Memory store: tracemalloc of the store's allocations. Redis (AOF
everysec, started here): INFO used_memory before and after.

No target; the figure sizes max_buffered_reports (a 1 GiB budget
holds 1 GiB / bytes-per-report reports).
"""

from __future__ import annotations

import argparse
import os
import sys
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.store import PendingWrite, QueueKey

KEY = QueueKey(window=20000, fingerprint=1234567890123)


def chunks(n: int, per_chunk: int) -> list[Chunk]:
    rng = np.random.default_rng(1)
    bits = rng.bytes(16 * per_chunk)
    cohorts = rng.integers(64, size=per_chunk).astype(np.uint32)
    return [Chunk(16, cohorts, bits) for _ in range(n // per_chunk)]


def memory_store(n: int, per_chunk: int) -> float:
    data = chunks(n, per_chunk)
    store = MemoryStore()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for c in data:
        store.append([PendingWrite.of("m", KEY, c)])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def redis_store(n: int, per_chunk: int) -> float:
    import redis

    from crowdmix.cluster import RedisServer
    from crowdmix.shuffler.redis_store import RedisStore

    server = RedisServer(appendonly=True)
    server.start()
    try:
        r = redis.Redis.from_url(server.url)
        store = RedisStore(server.url)
        before = int(r.info("memory")["used_memory"])
        data = chunks(n, per_chunk)
        step = max(1, 1000 // per_chunk)
        for i in range(0, len(data), step):  # several writes per MULTI, like a busy flush
            store.append([PendingWrite.of("m", KEY, c) for c in data[i : i + step]])
        after = int(r.info("memory")["used_memory"])
        store.close()
        return (after - before) / n
    finally:
        server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reports", type=int, default=1_000_000)
    args = ap.parse_args()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print("k = 128 (16 bytes of bits + 4-byte cohort = 20 bytes of payload per report)")
    for per_chunk, n in ((1000, args.reports), (1, min(args.reports, 200_000))):
        m = memory_store(n, per_chunk)
        print(f"[memory store] {per_chunk:>4} reports/chunk, {n:,} reports: {m:.1f} bytes/report")
        rd = redis_store(n, per_chunk)
        print(f"[redis store]  {per_chunk:>4} reports/chunk, {n:,} reports: {rd:.1f} bytes/report")


if __name__ == "__main__":
    main()

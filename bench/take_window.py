"""Redis ``take`` of a whole pending queue (a histogram window released in one batch):
the chunk-by-chunk move (the script of commit 98f02dc) against the whole-queue rename,
on the same redis-server in the same run. Every group commit adds one chunk per queue,
so a window of devices reporting one by one is mostly one- to four-report chunks; the
script blocks Redis (every shuffler's writes) while it runs.

    PYTHONPATH=. .venv/bin/python bench/take_window.py --chunks 200000
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time

from crowdmix.shuffler.redis_store import _INFLIGHT_HEADER, _TAKE, RedisStore
from crowdmix.shuffler.store import PendingWrite, QueueKey
from tests.redis_server import RedisServer
from tests.shuffler.helpers import unique_chunk

OLD_COMMIT = "98f02dc"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=200_000)
    args = ap.parse_args()
    old_source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:shuffler/redis_store.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    old = old_source.split('_TAKE = """', 1)[1].split('"""', 1)[0]
    server = RedisServer(appendonly=True, directory=tempfile.mkdtemp())
    server.start()
    try:
        store = RedisStore(server.url)
        key = QueueKey(window=1, fingerprint=5)
        write = PendingWrite.of("h", key, unique_chunk(4))
        for name, source in (("chunk-by-chunk (old)", old), ("whole-queue rename", _TAKE)):
            for _ in range(args.chunks // 1000):
                store.append([write] * 1000)
            script = store._redis.register_script(source)
            bid = name.encode().ljust(16, b".")[:16]
            t = time.perf_counter()
            n = script(
                keys=[
                    store._k("h", "pending"),
                    store._k("h", f"q:{key.field}"),
                    store._k("h", f"qn:{key.field}"),
                    store._k("h", "inflight"),
                    store._k("h", f"b:{bid.hex()}"),
                ],
                args=[key.field, 1, 10_000_000, bid, _INFLIGHT_HEADER.pack(1, 5)],
            )
            took = time.perf_counter() - t
            print(f"{name}: {args.chunks} chunks, {n} reports, take script {took:.3f} s")
            store.ack("h", bid)
        store.close()
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
